-- +goose Up

-- A dead letter's order and sequence (the event body's aggregate_id and
-- sequence, '' and 0 when it has none): while an order's earlier event is
-- dead-lettered and unresolved, the notification consumer keeps that
-- order's later events parked (CONTRACT.md v2: a refund email never
-- precedes that order's paid email), asking deadletter.Holds. Rows
-- recorded before this migration have none and hold nothing.
ALTER TABLE dead_letters
    ADD COLUMN aggregate_id text NOT NULL DEFAULT '',
    ADD COLUMN event_seq bigint NOT NULL DEFAULT 0;
CREATE INDEX dead_letters_aggregate ON dead_letters (aggregate_id, event_seq) WHERE aggregate_id <> '';

-- +goose Down
DROP INDEX IF EXISTS dead_letters_aggregate;
ALTER TABLE dead_letters DROP COLUMN aggregate_id, DROP COLUMN event_seq;
