-- The SQL of order.paid events in the worker, for pgbench: `make bench`
-- runs it as the database's limit for the worker's work. One transaction
-- is one batch of 16 events (notify.BatchSize; the consumer takes the
-- deliveries the broker has already sent, so a backlog comes in full
-- batches), and tests/bench counts 16 events per transaction, so both
-- sides of worker_over_pgbench are events per second. The consumer's part
-- (consumer.go HandleBatch, recordBatch) for events without a sequence,
-- as tests/bench publishes them: one batch (a pipeline here: one round
-- trip, one transaction) records the 16 inbox rows (inbox.QueueRecord)
-- and inserts the 16 notifications, and commits by itself (a batch with
-- sequenced events also takes inbox.Admit's cursor statements, in a
-- transaction). Then the sender's share (sender.go): one claim of up to 40
-- due notifications per 40 events (16 chances in 40 per batch), and the
-- update that marks each event's email sent (by id alone: here nothing set
-- it sending), one statement per email as the sender does. The emails
-- themselves are not SQL. The constants (-D) are set by tests/bench, which
-- also creates the orders 1..:orders the notifications reference.
-- TestPgbenchWorkerScriptMirrorsTheConsumer fails when the consumer's
-- statements change and this script does not.
\set ord1 random(1, :orders)
\set msg1 random(1, 9000000000000000000)
\set ntf1 random(1, 9000000000000000000)
\set ord2 random(1, :orders)
\set msg2 random(1, 9000000000000000000)
\set ntf2 random(1, 9000000000000000000)
\set ord3 random(1, :orders)
\set msg3 random(1, 9000000000000000000)
\set ntf3 random(1, 9000000000000000000)
\set ord4 random(1, :orders)
\set msg4 random(1, 9000000000000000000)
\set ntf4 random(1, 9000000000000000000)
\set ord5 random(1, :orders)
\set msg5 random(1, 9000000000000000000)
\set ntf5 random(1, 9000000000000000000)
\set ord6 random(1, :orders)
\set msg6 random(1, 9000000000000000000)
\set ntf6 random(1, 9000000000000000000)
\set ord7 random(1, :orders)
\set msg7 random(1, 9000000000000000000)
\set ntf7 random(1, 9000000000000000000)
\set ord8 random(1, :orders)
\set msg8 random(1, 9000000000000000000)
\set ntf8 random(1, 9000000000000000000)
\set ord9 random(1, :orders)
\set msg9 random(1, 9000000000000000000)
\set ntf9 random(1, 9000000000000000000)
\set ord10 random(1, :orders)
\set msg10 random(1, 9000000000000000000)
\set ntf10 random(1, 9000000000000000000)
\set ord11 random(1, :orders)
\set msg11 random(1, 9000000000000000000)
\set ntf11 random(1, 9000000000000000000)
\set ord12 random(1, :orders)
\set msg12 random(1, 9000000000000000000)
\set ntf12 random(1, 9000000000000000000)
\set ord13 random(1, :orders)
\set msg13 random(1, 9000000000000000000)
\set ntf13 random(1, 9000000000000000000)
\set ord14 random(1, :orders)
\set msg14 random(1, 9000000000000000000)
\set ntf14 random(1, 9000000000000000000)
\set ord15 random(1, :orders)
\set msg15 random(1, 9000000000000000000)
\set ntf15 random(1, 9000000000000000000)
\set ord16 random(1, :orders)
\set msg16 random(1, 9000000000000000000)
\set ntf16 random(1, 9000000000000000000)
\set claim random(1, 40)
\startpipeline
WITH r AS (INSERT INTO inbox (consumer, message_id) SELECT :consumer, m.id FROM (VALUES
    (:msg1::text), (:msg2::text), (:msg3::text), (:msg4::text), (:msg5::text), (:msg6::text), (:msg7::text), (:msg8::text), (:msg9::text), (:msg10::text), (:msg11::text), (:msg12::text), (:msg13::text), (:msg14::text), (:msg15::text), (:msg16::text)) AS m (id)
  ON CONFLICT DO NOTHING RETURNING message_id)
SELECT coalesce(json_agg(message_id), '[]') FROM r;
WITH ev (notification_id, order_id, tenant_id, recipient, order_amount, currency, traceparent) AS (VALUES
    (:ntf1, :ord1, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf2, :ord2, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf3, :ord3, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf4, :ord4, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf5, :ord5, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf6, :ord6, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf7, :ord7, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf8, :ord8, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf9, :ord9, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf10, :ord10, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf11, :ord11, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf12, :ord12, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf13, :ord13, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf14, :ord14, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf15, :ord15, :tenant, :email, :amount::bigint, :currency, :traceparent::text),
    (:ntf16, :ord16, :tenant, :email, :amount::bigint, :currency, :traceparent::text)),
notified AS (INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, event_seq, order_amount, currency, traceparent)
    SELECT ev.notification_id, ev.order_id, ev.tenant_id, :channel, ev.recipient, 'pending', :kind, NULL, ev.order_amount, ev.currency, ev.traceparent
    FROM ev
    ON CONFLICT DO NOTHING RETURNING id)
SELECT count(*) FROM notified;
\endpipeline
\if :claim <= 16
UPDATE notifications n
SET status = 'sending', attempts = n.attempts + 1,
    claimed_until = now() + :ttl::interval, next_attempt_at = now() + :ttl::interval
FROM (
    SELECT id FROM notifications
    WHERE status IN ('pending', 'sending') AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT 40
    FOR UPDATE SKIP LOCKED
) d
WHERE n.id = d.id
RETURNING n.id, n.order_id, n.recipient, n.attempts, coalesce(n.order_amount, 0), coalesce(n.currency, '');
\endif
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf1;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf2;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf3;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf4;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf5;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf6;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf7;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf8;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf9;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf10;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf11;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf12;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf13;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf14;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf15;
UPDATE notifications SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL WHERE id = :ntf16;
