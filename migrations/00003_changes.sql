-- The log of changes to tenants and keys, one row per revision, so replicas reload only what
-- changed since the revision they hold. tenant_id names the tenant changed (or the key's
-- tenant); key_id the key, '' for a change to the tenant itself. The store keeps the latest
-- rows only: a replica further behind reloads everything.

-- +goose Up
CREATE TABLE changes (
    rev       BIGINT NOT NULL PRIMARY KEY,
    tenant_id TEXT   NOT NULL,
    key_id    TEXT   NOT NULL
);

-- +goose Down
DROP TABLE changes;
