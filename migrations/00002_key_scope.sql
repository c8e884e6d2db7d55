-- A stored key's scope: the tier it runs at and whether it may manage the tenant's keys.
-- tier '' means the tenant's own tier (it follows the tenant's changes); a named tier is a cap:
-- the key runs at that tier, or at the tenant's when the tenant's is lower.
-- manage_keys 1: the key may create and revoke the tenant's keys within its own tier and expiry.
-- Keys stored before this migration keep the power they had: they may manage keys.

-- +goose Up
ALTER TABLE api_keys ADD COLUMN tier TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN manage_keys INTEGER NOT NULL DEFAULT 0;
UPDATE api_keys SET manage_keys = 1;

-- +goose Down
ALTER TABLE api_keys DROP COLUMN manage_keys;
ALTER TABLE api_keys DROP COLUMN tier;
