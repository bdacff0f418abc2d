-- The SQL of one paid checkout, as the service sends it, for pgbench:
-- `make bench` runs it as the database's limit for this work. A new key's
-- checkout is a first execution (fastpath.go): one batch per phase
-- (postgres.Batch, a pipeline here), each of its owners' statements,
-- committed on its own. Phase 1 is the claim (idempotency.Store.QueueClaimNew),
-- the catalog's check and the stock (the catalog is in the api's memory),
-- the order and its items (orders.QueueInsert), order.created
-- (outbox.Queue) and the create attempt (stripestep.QueueInsert); phase 2
-- the key's fence (idempotency.Fence.Queue), the create's answer
-- (stripestep.QueueFinish), the PaymentIntent (orders.QueueRecordIntent)
-- and the confirm attempt; phase 3 the confirm's answer, the key finished
-- (idempotency.Store.QueueFinish, fenced: it locks the key) and the order
-- paid with order.paid (orders.QueueApply). A guard's statement is wrapped as
-- postgres.Batch.QueueGuarded wraps it. The Stripe calls between the
-- phases are not SQL and are left out.
-- internal/api's TestPgbenchCheckoutScriptMirrorsTheCode fails when the
-- code's statements change and this script does not. The constants (-D)
-- are set by tests/bench; each checkout gets new random keys and ids.
\set key random(1, 9000000000000000000)
\set ord random(1, 9000000000000000000)
\set ev1 random(1, 9000000000000000000)
\set ev2 random(1, 9000000000000000000)
\set ak1 random(1, 9000000000000000000)
\set ak2 random(1, 9000000000000000000)
-- Phase 1 (the prices and currencies from the api's memory, checked here).
\startpipeline
INSERT INTO idempotency_keys
  (tenant_id, route, key, fingerprint, recovery_point, order_id, lease_owner, lease_expires_at, created_at, updated_at)
VALUES (:tenant, :route, :key, :fingerprint, :rp_order_created, :ord, :owner, :lease_until, :now, :now)
RETURNING id;
WITH g AS (
  SELECT 1 FROM product_catalog c
  JOIN unnest(:skus::text[], :prices::bigint[], :currencies::text[]) AS w (sku, unit_amount, currency)
    ON c.sku = w.sku AND c.unit_amount = w.unit_amount AND c.currency = w.currency
  HAVING count(*) = :nskus),
ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), :guard) AS held)
SELECT g.* FROM ok LEFT JOIN g ON true;
WITH g AS (SELECT 1 WHERE reserve_stock(:skus::text[], :qtys::bigint[])),
ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), :guard) AS held)
SELECT g.* FROM ok LEFT JOIN g ON true;
INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, return_url, created_at, updated_at)
VALUES (:ord, :tenant, :pending, :email, :currency, :amount, :pm, NULLIF(:return_url, ''), :now, :now);
INSERT INTO order_items (order_id, line, sku, quantity, unit_amount, amount)
SELECT :ord, t.line, t.sku, t.quantity, t.unit_amount, t.amount
FROM unnest(:lines::int[], :skus::text[], :qtys::int[], :amounts::bigint[], :amounts::bigint[]) AS t (line, sku, quantity, unit_amount, amount);
INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_seq, type, payload, occurred_at, traceparent)
SELECT :ev1, :tenant, :ord, s.n, :created, (:payload_seq || s.n || '}')::json, :now, :traceparent
FROM (SELECT outbox_next_seq(:ord) AS n) s;
WITH g AS (INSERT INTO payment_attempts
  (order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
  VALUES (:ord, :tenant, :step_create, :one, :ak1, NULL, :params::jsonb, :now, :now)
  ON CONFLICT DO NOTHING RETURNING id),
ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), :guard) AS held)
SELECT g.* FROM ok LEFT JOIN g ON true;
\endpipeline
-- Phase 2, after the create, committed without waiting for the WAL flush.
\startpipeline
SELECT set_config('synchronous_commit', 'off', true);
WITH g AS (SELECT 1 FROM idempotency_keys
  WHERE tenant_id = :tenant AND route = :route AND key = :key AND lease_owner = :owner AND recovery_point <> :rp_finished),
ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), :guard) AS held)
SELECT g.* FROM ok LEFT JOIN g ON true;
UPDATE payment_attempts SET outcome = :succeeded,
    stripe_object_id = COALESCE(:pi, stripe_object_id), stripe_status = COALESCE(:pi_created, stripe_status),
    error = NULL, updated_at = :now
WHERE idempotency_key = :ak1;
WITH g AS (UPDATE orders SET payment_intent_id = COALESCE(payment_intent_id, :pi),
    payment_status = CASE WHEN payment_intent_id IS NULL OR payment_intent_id = :pi THEN :pi_created ELSE payment_status END,
    payment_unknown_since = NULL, updated_at = :now
  WHERE id = :ord AND (payment_intent_id IS NULL OR payment_intent_id = :pi) RETURNING id),
ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), :guard) AS held)
SELECT g.* FROM ok LEFT JOIN g ON true;
WITH g AS (INSERT INTO payment_attempts
  (order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
  VALUES (:ord, :tenant, :step_confirm, :one, :ak2, :pi, :params::jsonb, :now, :now)
  ON CONFLICT DO NOTHING RETURNING id),
ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), :guard) AS held)
SELECT g.* FROM ok LEFT JOIN g ON true;
\endpipeline
-- Phase 3, after the confirm.
\startpipeline
UPDATE payment_attempts SET outcome = :succeeded,
    stripe_object_id = COALESCE(:pi, stripe_object_id), stripe_status = COALESCE(:succeeded, stripe_status),
    error = NULL, updated_at = :now
WHERE idempotency_key = :ak2;
WITH g AS (UPDATE idempotency_keys
  SET recovery_point = :rp_finished, response_status = :status, response_headers = :headers, response_body = :body,
      lease_owner = NULL, lease_expires_at = NULL, finished_at = :now, updated_at = :now, expires_at = :expires
  WHERE tenant_id = :tenant AND route = :route AND key = :key AND lease_owner = :owner AND recovery_point <> :rp_finished
  RETURNING expires_at),
ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), :guard) AS held)
SELECT g.* FROM ok LEFT JOIN g ON true;
WITH g AS (UPDATE orders SET status = :paid,
    payment_intent_id = COALESCE(NULLIF(:pi, ''), payment_intent_id),
    payment_status = COALESCE(NULLIF(:succeeded, ''), payment_status),
    payment_next_action = CASE WHEN :paid = 'requires_action' THEN NULL::jsonb ELSE payment_next_action END,
    payment_client_secret = CASE WHEN :paid = 'requires_action' THEN NULLIF(NULL, '') ELSE payment_client_secret END,
    payment_failure_code = NULLIF(NULL, ''),
    payment_decline_code = NULLIF(NULL, ''),
    requires_action_at = CASE WHEN :paid = 'requires_action' THEN :now ELSE requires_action_at END,
    payment_unknown_since = CASE WHEN :paid = 'payment_unknown' THEN payment_unknown_since ELSE NULL END,
    updated_at = :now
  WHERE id = :ord AND status = ANY(:to_paid_from::text[]) RETURNING id),
ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), :guard) AS held)
SELECT g.* FROM ok LEFT JOIN g ON true;
INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_seq, type, payload, occurred_at, traceparent)
SELECT :ev2, :tenant, :ord, s.n, :paid_event, (:payload_seq || s.n || '}')::json, :now, :traceparent
FROM (SELECT outbox_next_seq(:ord) AS n) s;
\endpipeline
