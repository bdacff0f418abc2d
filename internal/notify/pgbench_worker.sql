-- The SQL of one order.paid event in the worker, for pgbench: `make bench`
-- runs it as the database's limit for the worker's work. The consumer's
-- transaction (consumer.go Handle, internal/inbox Record, then apply) for an
-- event without a sequence, as tests/bench publishes them (a sequenced one
-- also takes inbox.Admit's cursor statements), then the
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
INSERT INTO inbox (consumer, message_id) VALUES (:consumer, :msg) ON CONFLICT DO NOTHING;
INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, event_seq)
VALUES (:ntf, :ord, :tenant, :channel, :email, 'pending', :kind, NULL)
ON CONFLICT DO NOTHING;
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
