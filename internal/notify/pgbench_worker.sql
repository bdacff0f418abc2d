-- The SQL of one order.paid event in the worker, for pgbench: `make bench`
-- runs it as the database's limit for the worker's work. The consumer's
-- transaction (consumer.go Handle, internal/inbox Record), then the
-- sender's share (sender.go): one claim of up to 20 due notifications per
-- 20 events, and the update that marks this event's email sent (by id
-- alone: here nothing set it sending). The email itself is not SQL. The
-- constants (-D) are set by tests/bench, which also creates the orders
-- 1..:orders the notifications reference. TestPgbenchWorkerScriptMirrorsTheConsumer
-- fails when the consumer's statements change and this script does not.
\set ord random(1, :orders)
\set msg random(1, 9000000000000000000)
\set ntf random(1, 9000000000000000000)
\set claim random(1, 20)
BEGIN;
WITH i AS (INSERT INTO inbox (consumer, message_id) VALUES (:consumer, :msg) ON CONFLICT DO NOTHING RETURNING 1),
n AS (
    INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status)
    SELECT :ntf, :ord, :tenant, :channel, :email, 'pending' WHERE EXISTS (SELECT 1 FROM i)
    ON CONFLICT (order_id, channel) DO NOTHING
    RETURNING 1)
SELECT (SELECT count(*) FROM i), (SELECT count(*) FROM n);
COMMIT;
\if :claim = 1
UPDATE notifications n
SET status = 'sending', attempts = n.attempts + 1,
    claimed_until = now() + :ttl::interval, next_attempt_at = now() + :ttl::interval
FROM (
    SELECT id FROM notifications
    WHERE status IN ('pending', 'sending') AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT 20
    FOR UPDATE SKIP LOCKED
) d, orders o
WHERE n.id = d.id AND o.id = n.order_id
RETURNING n.id, n.order_id, n.recipient, n.attempts, o.amount_total, o.currency;
\endif
UPDATE notifications
SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL
WHERE id = :ntf;
