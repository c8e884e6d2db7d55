-- Console sessions, server-side so that signing out, or an admin ending a session, refuses its
-- cookie on every replica. id_sha256 is the SHA-256 of the session's secret id (the cookie holds
-- the id, never stored); key_id names the admin and viewer tokens the session was opened under,
-- so rotating a token ends every session opened before.

-- +goose Up
CREATE TABLE console_sessions (
    id_sha256       TEXT   NOT NULL PRIMARY KEY,
    key_id          TEXT   NOT NULL,
    role            TEXT   NOT NULL,
    remote          TEXT   NOT NULL,
    user_agent      TEXT   NOT NULL,
    created_at_ms   BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL,
    last_seen_at_ms BIGINT NOT NULL
);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at_ms);

-- +goose Down
DROP TABLE console_sessions;
