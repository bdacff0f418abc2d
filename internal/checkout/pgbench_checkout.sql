-- The SQL of one paid checkout, as the service sends it (transaction 1 in
-- service.go createOrder and store.go, the key store in
-- internal/idempotency/store.go, the payment saga's steps in saga.go and
-- store.go, its settling transaction in saga.go), for pgbench: `make bench`
-- runs it as the database's limit for this work.
-- internal/api's TestPgbenchCheckoutScriptMirrorsTheCode fails when the code's
-- statements change and this script does not. The Stripe calls between the
-- statements are not SQL and are left out. The constants (-D) are set by
-- tests/bench; each checkout gets new random keys and ids. Events get their
-- per-order sequence from outbox_next_seq, as outbox.Add and
-- outbox.Statement write them.
\set key random(1, 9000000000000000000)
\set ord random(1, 9000000000000000000)
\set ev1 random(1, 9000000000000000000)
\set ev2 random(1, 9000000000000000000)
\set ak1 random(1, 9000000000000000000)
\set ak2 random(1, 9000000000000000000)
BEGIN;
INSERT INTO idempotency_keys
  (tenant_id, route, key, fingerprint, recovery_point, lease_owner, lease_expires_at, created_at, updated_at, expires_at)
VALUES (:tenant, :route, :key, :fingerprint, :rp_started, :owner, :lease_until, :now, :now, :expires)
ON CONFLICT (tenant_id, route, key) DO NOTHING
RETURNING id \gset
SELECT sku, name, unit_amount, currency FROM product_catalog WHERE sku = ANY(:skus::text[]);
WITH r AS MATERIALIZED (SELECT reserve_stock(:skus::text[], :qtys::bigint[]) AS ok),
o AS (
  INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
  SELECT :ord, :tenant, :pending, :email, :currency, :amount, :pm, :now::timestamptz, :now::timestamptz FROM r WHERE r.ok
  RETURNING id),
i AS (
  INSERT INTO order_items (order_id, line, sku, quantity, unit_amount, amount)
  SELECT o.id, t.line, t.sku, t.quantity, t.unit_amount, t.amount
  FROM o, unnest(:lines::int[], :skus::text[], :qtys::int[], :amounts::bigint[], :amounts::bigint[]) AS t (line, sku, quantity, unit_amount, amount)),
e AS (INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_seq, type, payload, occurred_at)
  SELECT :ev1, :tenant, :ord, s.n, :created, (:payload_seq || s.n || '}')::json, :now
  FROM (SELECT outbox_next_seq(:ord) AS n) s WHERE EXISTS (SELECT 1 FROM o)),
k AS (UPDATE idempotency_keys SET recovery_point = :rp_order_created, order_id = :ord, updated_at = :now
  WHERE id = :id AND lease_owner = :owner AND recovery_point <> :rp_finished AND EXISTS (SELECT 1 FROM o) RETURNING id)
SELECT r.ok AS reserved, (SELECT count(*) FROM k) AS advanced FROM r;
COMMIT;
-- The saga's create step: its attempt written (fenced by the key's lease)
-- before the call, its answer after, the PaymentIntent recorded.
SELECT * FROM payment_attempts WHERE order_id = :ord AND step = :step_create ORDER BY step, attempt;
INSERT INTO payment_attempts (order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
SELECT :ord, :tenant, :step_create, :one, :ak1, NULL, :params::jsonb, :now, :now
WHERE EXISTS (SELECT 1 FROM idempotency_keys WHERE id = :id AND lease_owner = :owner)
ON CONFLICT DO NOTHING RETURNING id \gset att_
UPDATE payment_attempts SET outcome = COALESCE(NULLIF(:succeeded, ''), outcome),
    stripe_object_id = COALESCE(:pi, stripe_object_id), stripe_status = COALESCE(:pi_created, stripe_status),
    error = NULLIF(NULL, ''), updated_at = :now
WHERE id = :att_id;
UPDATE orders SET payment_intent_id = COALESCE(payment_intent_id, :pi),
    payment_status = CASE WHEN payment_intent_id IS NULL OR payment_intent_id = :pi THEN :pi_created ELSE payment_status END,
    payment_unknown_since = NULL, updated_at = :now
WHERE id = :ord RETURNING payment_intent_id;
-- The confirm step.
SELECT * FROM payment_attempts WHERE order_id = :ord AND step = :step_confirm ORDER BY step, attempt;
INSERT INTO payment_attempts (order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
SELECT :ord, :tenant, :step_confirm, :one, :ak2, :pi, :params::jsonb, :now, :now
WHERE EXISTS (SELECT 1 FROM idempotency_keys WHERE id = :id AND lease_owner = :owner)
ON CONFLICT DO NOTHING RETURNING id \gset att_
UPDATE payment_attempts SET outcome = COALESCE(NULLIF(:succeeded, ''), outcome),
    stripe_object_id = COALESCE(:pi, stripe_object_id), stripe_status = COALESCE(:succeeded, stripe_status),
    error = NULLIF(NULL, ''), updated_at = :now
WHERE id = :att_id;
-- The settling transaction: the order paid, its event, the key finished.
BEGIN;
UPDATE orders SET status = :paid,
    payment_intent_id = COALESCE(NULLIF(:pi, ''), payment_intent_id),
    payment_status = COALESCE(NULLIF(:succeeded, ''), payment_status),
    payment_next_action = CASE WHEN :paid = 'requires_action' THEN NULL::jsonb ELSE payment_next_action END,
    payment_client_secret = CASE WHEN :paid = 'requires_action' THEN NULLIF(NULL, '') ELSE payment_client_secret END,
    payment_failure_code = NULLIF(NULL, ''),
    payment_decline_code = NULLIF(NULL, ''),
    requires_action_at = CASE WHEN :paid = 'requires_action' THEN :now ELSE requires_action_at END,
    payment_unknown_since = CASE WHEN :paid = 'payment_unknown' THEN payment_unknown_since ELSE NULL END,
    updated_at = :now
WHERE id = :ord AND status IN (:pending, :payment_unknown, :requires_action);
SELECT * FROM order_items WHERE order_items.order_id = :ord;
SELECT * FROM orders WHERE id = :ord AND tenant_id = :tenant LIMIT :one;
INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_seq, type, payload, occurred_at)
SELECT :ev2, :tenant, :ord, s.n, :paid_event, (:payload_seq || s.n || '}')::json, :now
FROM (SELECT outbox_next_seq(:ord) AS n) s;
SELECT * FROM order_items WHERE order_items.order_id = :ord;
SELECT * FROM orders WHERE id = :ord AND tenant_id = :tenant LIMIT :one;
UPDATE idempotency_keys
SET recovery_point = :rp_finished, response_status = :status, response_headers = :headers, response_body = :body,
    lease_owner = NULL, lease_expires_at = NULL, finished_at = :now, updated_at = :now
WHERE id = :id AND lease_owner = :owner AND recovery_point <> :rp_finished
RETURNING expires_at;
COMMIT;
