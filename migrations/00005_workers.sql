-- The workers added, changed and removed through the admin API at run time, shared by every
-- replica and kept across restarts. spec is the worker's declaration as JSON (routing's
-- WorkerSpec, the admin API's body); the config file's and discovery's workers are never here.

-- +goose Up
CREATE TABLE workers (
    id            TEXT   NOT NULL PRIMARY KEY,
    spec          TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);

-- +goose Down
DROP TABLE workers;
