-- +goose Up

-- An email says the order's amount and currency. The sender read them by
-- joining orders, which package orders owns (docs/DESIGN.md, "v3: one owner
-- per table"); order.paid carries the order, and the consumer reads the
-- order's address for order.refunded through orders' API anyway, so it now
-- copies the amount and the currency into the notification it creates and
-- the sender reads its own row, as 00011 did for a refund's amount. An
-- order's total and currency never change once it is created.
--
-- Nullable columns without a default: a catalog change only, no rewrite.
ALTER TABLE notifications ADD COLUMN IF NOT EXISTS order_amount bigint;
ALTER TABLE notifications ADD COLUMN IF NOT EXISTS currency text;

-- Notifications created before this migration get them from their order.
-- One an older worker creates in between (the worker is upgraded with the
-- api that applies this) has none, and its email would say 0.00 with no
-- currency; the same window as 00011's.
UPDATE notifications n SET order_amount = o.amount_total, currency = o.currency
FROM orders o
WHERE o.id = n.order_id AND n.order_amount IS NULL;

-- +goose Down
ALTER TABLE notifications DROP COLUMN IF EXISTS currency;
ALTER TABLE notifications DROP COLUMN IF EXISTS order_amount;
