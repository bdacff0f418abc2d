-- +goose NO TRANSACTION
-- +goose Up

-- A key's retention counts from its final answer (CONTRACT.md v4,
-- Retention): expires_at is set when the key finishes, IDEMPOTENCY_TTL after
-- it (idempotency.Store.Finish, the one place), and is NULL while the key is
-- unfinished, so an unfinished key never expires and is never reaped,
-- however long a Stripe outage or a parked refund keeps it open. Before,
-- expires_at was set at the claim, and a key that finished later than
-- IDEMPOTENCY_TTL was run again as new by its next retry: a second charge.
--
-- No transaction: in one, the ALTER's ACCESS EXCLUSIVE lock would be held
-- while the UPDATEs and the CHECK's validation scan the table, which holds
-- a day of keys (every checkout would wait). Each statement commits on its
-- own instead, and every one is safe to run again if the migration stops
-- half way (goose then runs it all again).

-- Metadata only.
ALTER TABLE idempotency_keys ALTER COLUMN expires_at DROP NOT NULL;

-- Rows written before held created_at + the TTL of the build that claimed
-- them. An unfinished key has no end of retention now (few rows; the
-- UPDATE reads the partial index idempotency_keys_unfinished).
UPDATE idempotency_keys SET expires_at = NULL WHERE recovery_point <> 'finished' AND expires_at IS NOT NULL;

-- A finished key keeps that TTL, counted from when it finished. Only the
-- keys that took more than a second are moved: those are the ones an
-- outage, a takeover or a parked refund delayed (a key that finished late
-- and is already past its old end, not reaped yet, replays again), while
-- rewriting every row to add the few milliseconds a normal request takes
-- would rewrite the whole table. Run twice, it moves such a key's end
-- later once more: a longer retention, never a shorter one.
UPDATE idempotency_keys SET expires_at = finished_at + (expires_at - created_at)
WHERE recovery_point = 'finished' AND finished_at > created_at + interval '1 second';

-- A finished key always has an end of retention: without one the reaper,
-- which deletes finished keys by expires_at through the partial index
-- idempotency_keys_expires (expires_at) WHERE recovery_point = 'finished',
-- would keep it forever. That index is unchanged: it already holds only
-- finished keys, the only ones with an expires_at. NOT VALID and then
-- VALIDATE: the scan of the existing rows takes no lock that blocks writes.
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_finished_expires;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_finished_expires
    CHECK (recovery_point <> 'finished' OR expires_at IS NOT NULL) NOT VALID;
ALTER TABLE idempotency_keys VALIDATE CONSTRAINT idempotency_keys_finished_expires;

-- +goose Down
ALTER TABLE idempotency_keys DROP CONSTRAINT IF EXISTS idempotency_keys_finished_expires;
-- Older builds fix expires_at at the claim and need one on every row: an
-- unfinished key gets a default IDEMPOTENCY_TTL (24h) from now, so it is
-- not already expired when it finishes under the older build.
UPDATE idempotency_keys SET expires_at = GREATEST(created_at, now()) + interval '24 hours'
WHERE expires_at IS NULL;
ALTER TABLE idempotency_keys ALTER COLUMN expires_at SET NOT NULL;
