-- The stored key that minted a key, '' for a key the admin made (or made before this
-- migration): a budget set on a key bounds the keys it minted, and theirs, too.

-- +goose Up
ALTER TABLE api_keys ADD COLUMN parent_id TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE api_keys DROP COLUMN parent_id;
