-- Budgets set through the admin API, overriding the tier's: per tenant (key_id '') they replace
-- the tier's budget for that tenant; per key they cap that key too, beside its tenant's budget.
-- 0 means no cap.

-- +goose Up
CREATE TABLE budgets (
    tenant_id          TEXT   NOT NULL,
    key_id             TEXT   NOT NULL,
    tokens_per_day     BIGINT NOT NULL DEFAULT 0,
    tokens_per_month   BIGINT NOT NULL DEFAULT 0,
    requests_per_day   BIGINT NOT NULL DEFAULT 0,
    requests_per_month BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, key_id)
);

-- +goose Down
DROP TABLE budgets;
