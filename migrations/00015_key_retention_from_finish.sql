-- +goose Up

-- A key's retention counts from its final answer (CONTRACT.md v4,
-- Retention): expires_at is set when the key finishes, IDEMPOTENCY_TTL after
-- it (idempotency.Store.Finish, the one place), and is NULL while the key is
-- unfinished, so an unfinished key never expires and is never reaped,
-- however long a Stripe outage or a parked refund keeps it open. Before,
-- expires_at was set at the claim and a key that finished later than
-- IDEMPOTENCY_TTL was run again as new by its next retry: a second charge.
ALTER TABLE idempotency_keys ALTER COLUMN expires_at DROP NOT NULL;

-- Rows written before held created_at + the TTL of the build that claimed
-- them. An unfinished key has no end of retention now (this UPDATE reads the
-- partial index idempotency_keys_unfinished). A finished key keeps that TTL,
-- counted from when it finished: one that finished late replays for its
-- whole retention, including one already past its old end that the reaper
-- has not deleted yet.
UPDATE idempotency_keys SET expires_at = NULL WHERE recovery_point <> 'finished';
UPDATE idempotency_keys SET expires_at = finished_at + (expires_at - created_at)
WHERE recovery_point = 'finished' AND finished_at > created_at;

-- A finished key always has an end of retention: without one the reaper,
-- which deletes finished keys by expires_at through the partial index
-- idempotency_keys_expires (expires_at) WHERE recovery_point = 'finished',
-- would keep it forever. That index is unchanged: it already holds only
-- finished keys, the only ones with an expires_at.
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_finished_expires
    CHECK (recovery_point <> 'finished' OR expires_at IS NOT NULL);

-- +goose Down
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_finished_expires;
-- Older builds fix expires_at at the claim and need one on every row: an
-- unfinished key gets a default IDEMPOTENCY_TTL (24h) from now, so it is
-- not already expired when it finishes under the older build.
UPDATE idempotency_keys SET expires_at = GREATEST(created_at, now()) + interval '24 hours'
WHERE expires_at IS NULL;
ALTER TABLE idempotency_keys ALTER COLUMN expires_at SET NOT NULL;
