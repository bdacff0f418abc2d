-- +goose Up

-- parked_max is the highest sequence a consumer has parked for the
-- aggregate (0: none ever): inbox.Admit reads it from the cursor row its
-- upsert has just locked, which is the row as it is now, and looks in
-- inbox_parked for successors to unpark only when it lies past the event
-- it admits. So an event in order costs one statement instead of three.
-- It only grows; past applied_seq it means "maybe something parked".
--
-- Rollout: a worker of before this migration parks without raising it.
-- An event such a worker parks while a new worker applies its predecessor
-- waits until inbox.ReleaseOverdue (NOTIFY_SEQUENCE_WAIT) lets it go: late,
-- never lost. Rows parked before the migration are covered by the backfill.
ALTER TABLE inbox_sequences ADD COLUMN parked_max bigint NOT NULL DEFAULT 0;
UPDATE inbox_sequences s SET parked_max = p.max_seq
FROM (SELECT consumer, aggregate_id, max(seq) AS max_seq FROM inbox_parked GROUP BY consumer, aggregate_id) p
WHERE s.consumer = p.consumer AND s.aggregate_id = p.aggregate_id;

-- +goose Down
ALTER TABLE inbox_sequences DROP COLUMN parked_max;
