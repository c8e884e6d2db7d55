-- Tenants, their API keys and the audit log of every change.
-- Times are unix milliseconds (BIGINT) so both dialects store and return them alike.

-- +goose Up
CREATE TABLE tenants (
    id            TEXT   NOT NULL PRIMARY KEY,
    name          TEXT   NOT NULL,
    tier          TEXT   NOT NULL,
    status        TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id              TEXT   NOT NULL PRIMARY KEY,
    tenant_id       TEXT   NOT NULL REFERENCES tenants (id),
    name            TEXT   NOT NULL,
    secret_sha256   TEXT   NOT NULL,
    created_at_ms   BIGINT NOT NULL,
    expires_at_ms   BIGINT,
    revoked_at_ms   BIGINT,
    last_used_at_ms BIGINT
);
CREATE INDEX api_keys_tenant_id ON api_keys (tenant_id);

-- id sorts by time: 16 hex digits of unix milliseconds, 12 of a per-process sequence, 8 random.
CREATE TABLE audit_log (
    id         TEXT   NOT NULL PRIMARY KEY,
    at_ms      BIGINT NOT NULL,
    actor      TEXT   NOT NULL,
    action     TEXT   NOT NULL,
    tenant_id  TEXT   NOT NULL,
    object     TEXT   NOT NULL,
    details    TEXT   NOT NULL
);
CREATE INDEX audit_log_object ON audit_log (object);
CREATE INDEX audit_log_tenant_id ON audit_log (tenant_id);

-- One row; every change to tenants or keys increments rev in the same transaction, so replicas
-- learn of changes by reading one number.
CREATE TABLE revision (
    id  INTEGER NOT NULL PRIMARY KEY,
    rev BIGINT  NOT NULL
);
INSERT INTO revision (id, rev) VALUES (1, 0);

-- +goose Down
DROP TABLE revision;
DROP TABLE audit_log;
DROP TABLE api_keys;
DROP TABLE tenants;
