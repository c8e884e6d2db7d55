-- The verdicts of the calls against their tier's latency objectives (issue 31), so a tenant's
-- attainment is a query: ttft_* and tpot_* count the calls that met or missed each objective,
-- objectives_* the calls that missed neither (met: goodput) or missed one. A call neither met
-- nor missed was unjudged (no objective could be stated) or not judged (refused). Rows written
-- before this migration count none.

-- +goose Up
ALTER TABLE usage_ledger ADD COLUMN ttft_met BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_ledger ADD COLUMN ttft_missed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_ledger ADD COLUMN tpot_met BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_ledger ADD COLUMN tpot_missed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_ledger ADD COLUMN objectives_met BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_ledger ADD COLUMN objectives_missed BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE usage_ledger DROP COLUMN objectives_missed;
ALTER TABLE usage_ledger DROP COLUMN objectives_met;
ALTER TABLE usage_ledger DROP COLUMN tpot_missed;
ALTER TABLE usage_ledger DROP COLUMN tpot_met;
ALTER TABLE usage_ledger DROP COLUMN ttft_missed;
ALTER TABLE usage_ledger DROP COLUMN ttft_met;
