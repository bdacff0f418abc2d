-- +goose Up

-- A refund's email says how much was refunded. The sender read it from the
-- refunds table, which package refunds owns (docs/DESIGN.md, "v3: one
-- owner per table"); the order.refunded event carries the refund, amount
-- included, so the consumer now copies the amount into the notification it
-- creates from that event, and the sender reads its own row. A refund's
-- amount never changes, so the copy cannot go stale.
--
-- A nullable column without a default is a catalog change only: no rewrite.
-- NULL for an order_paid notification.
ALTER TABLE notifications ADD COLUMN IF NOT EXISTS refund_amount bigint;

-- The refund notifications created before this migration get their amount
-- from the refund. The worker is upgraded with the api that applies this
-- migration: a refund notification an older worker creates in between
-- (none unless a refund succeeds in that window) has no amount, and its
-- email would say 0.00.
UPDATE notifications n SET refund_amount = r.amount
FROM refunds r
WHERE r.id = n.refund_id AND n.kind = 'order_refunded' AND n.refund_amount IS NULL;

-- +goose Down
ALTER TABLE notifications DROP COLUMN IF EXISTS refund_amount;
