-- The usage ledger: what each tenant's key spent on each model and class, per hour (period
-- 'hour') and, once hours are older than the ledger's hourly retention, per day (period 'day').
-- start is the period's first millisecond (unix ms, UTC). requests counts every call that reached
-- a queue, whatever its end; the error columns count those that ended in that error. estimated
-- counts the calls whose usage was counted from the stream because the engine's never came.
-- usage_folds names the batches already added, so a batch folded twice (a replica that died
-- between writing it and forgetting it) is added once.

-- +goose Up
CREATE TABLE usage_ledger (
    period            TEXT   NOT NULL,
    start             BIGINT NOT NULL,
    tenant_id         TEXT   NOT NULL,
    key_id            TEXT   NOT NULL,
    model             TEXT   NOT NULL,
    class             TEXT   NOT NULL,
    requests          BIGINT NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT NOT NULL DEFAULT 0,
    cached_tokens     BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    estimated         BIGINT NOT NULL DEFAULT 0,
    refused_limit     BIGINT NOT NULL DEFAULT 0,
    refused_budget    BIGINT NOT NULL DEFAULT 0,
    queue_full        BIGINT NOT NULL DEFAULT 0,
    deadline          BIGINT NOT NULL DEFAULT 0,
    worker_errors     BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (period, start, tenant_id, key_id, model, class)
);
CREATE INDEX usage_ledger_tenant ON usage_ledger (tenant_id, start);

CREATE TABLE usage_folds (
    id TEXT   NOT NULL PRIMARY KEY,
    at BIGINT NOT NULL
);

-- +goose Down
DROP TABLE usage_folds;
DROP TABLE usage_ledger;
