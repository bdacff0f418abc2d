-- The SQL of one order.paid event as the worker's consumer sends it
-- (consumer.go Handle, internal/inbox Record), for pgbench: `make bench`
-- runs it as the database's limit for the worker's work. The constants (-D)
-- are set by tests/bench, which also creates the orders 1..:orders the
-- notifications reference.
\set ord random(1, :orders)
\set msg random(1, 9000000000000000000)
\set ntf random(1, 9000000000000000000)
BEGIN;
INSERT INTO inbox (consumer, message_id) VALUES (:consumer, :msg) ON CONFLICT DO NOTHING;
INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status)
VALUES (:ntf, :ord, :tenant, :channel, :email, 'pending')
ON CONFLICT (order_id, channel) DO NOTHING;
COMMIT;
