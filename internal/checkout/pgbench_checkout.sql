-- The SQL of one paid checkout, as the service sends it, for pgbench:
-- `make bench` runs it as the database's limit for this work. A new key's
-- checkout is a first execution (first.go): one statement per phase, each
-- of data-modifying CTEs committed on its own. Phase 1 is the claim (idempotency.Store.ClaimNewStatement), the stock, the
-- order, its items, order.created and the create attempt (the catalog is
-- in the api's memory; the statement checks its prices); phase 2 the
-- create's answer, the PaymentIntent and the confirm attempt; phase 3 the
-- confirm's answer, the order paid, order.paid and the key finished
-- (idempotency.Store.FinishStatement). The Stripe calls between them are
-- not SQL and are left out.
-- internal/api's TestPgbenchCheckoutScriptMirrorsTheCode fails when the
-- code's statements change and this script does not. The constants (-D)
-- are set by tests/bench; each checkout gets new random keys and ids.
-- Events get their per-order sequence from outbox_next_seq, as
-- outbox.Statement writes them.
\set key random(1, 9000000000000000000)
\set ord random(1, 9000000000000000000)
\set ev1 random(1, 9000000000000000000)
\set ev2 random(1, 9000000000000000000)
\set ak1 random(1, 9000000000000000000)
\set ak2 random(1, 9000000000000000000)
-- Phase 1 (the prices and currencies from the api's memory, checked here).
WITH p AS MATERIALIZED (
  SELECT count(*) = :nskus AS current FROM product_catalog c
  JOIN unnest(:skus::text[], :prices::bigint[], :currencies::text[]) AS w (sku, unit_amount, currency)
    ON c.sku = w.sku AND c.unit_amount = w.unit_amount AND c.currency = w.currency),
r AS MATERIALIZED (SELECT reserve_stock(:skus::text[], :qtys::bigint[]) AS ok FROM p WHERE p.current),
k AS (INSERT INTO idempotency_keys
  (tenant_id, route, key, fingerprint, recovery_point, order_id, lease_owner, lease_expires_at,
   response_status, response_headers, response_body, finished_at, created_at, updated_at, expires_at)
  SELECT :tenant, :route, :key, :fingerprint, CASE WHEN r.ok THEN :rp_order_created::text ELSE :rp_finished END,
    CASE WHEN r.ok THEN :ord::text END, CASE WHEN r.ok THEN :owner::text END, CASE WHEN r.ok THEN :lease_until::timestamptz END,
    CASE WHEN r.ok THEN NULL ELSE :status::int END, CASE WHEN r.ok THEN NULL ELSE :headers::jsonb END,
    CASE WHEN r.ok THEN NULL ELSE :body::bytea END, CASE WHEN r.ok THEN NULL ELSE :now::timestamptz END,
    :now, :now, :expires
  FROM r RETURNING id, expires_at),
o AS (
  INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, return_url, created_at, updated_at)
  SELECT :ord, :tenant, :pending, :email, :currency, :amount, :pm, nullif(:return_url, ''), :now::timestamptz, :now::timestamptz FROM r WHERE r.ok
  RETURNING id),
i AS (
  INSERT INTO order_items (order_id, line, sku, quantity, unit_amount, amount)
  SELECT o.id, t.line, t.sku, t.quantity, t.unit_amount, t.amount
  FROM o, unnest(:lines::int[], :skus::text[], :qtys::int[], :amounts::bigint[], :amounts::bigint[]) AS t (line, sku, quantity, unit_amount, amount)),
e AS (INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_seq, type, payload, occurred_at)
  SELECT :ev1, :tenant, :ord, s.n, :created, (:payload_seq || s.n || '}')::json, :now
  FROM (SELECT outbox_next_seq(:ord) AS n) s WHERE EXISTS (SELECT 1 FROM o)),
a AS (INSERT INTO payment_attempts
  (order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
  SELECT :ord, :tenant, :step_create, :one, :ak1, NULL, :params::jsonb, :now, :now
  WHERE EXISTS (SELECT 1 FROM o) ON CONFLICT DO NOTHING RETURNING id)
SELECT r.ok AS reserved, k.id AS key_id, k.expires_at, (SELECT id FROM a) AS create_id FROM r, k \gset
-- Phase 2, after the create, committed without waiting for the WAL flush.
WITH sc AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)),
a AS (UPDATE payment_attempts SET outcome = :succeeded,
    stripe_object_id = COALESCE(:pi, stripe_object_id), stripe_status = COALESCE(:pi_created, stripe_status),
    error = NULL, updated_at = :now
  WHERE id = :create_id),
o AS (UPDATE orders SET payment_intent_id = COALESCE(payment_intent_id, :pi),
    payment_status = CASE WHEN payment_intent_id IS NULL OR payment_intent_id = :pi THEN :pi_created ELSE payment_status END,
    payment_unknown_since = NULL, updated_at = :now
  WHERE id = :ord RETURNING payment_intent_id),
c AS (INSERT INTO payment_attempts
  (order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
  SELECT :ord, :tenant, :step_confirm, :one, :ak2, :pi, :params::jsonb, :now, :now
  WHERE EXISTS (SELECT 1 FROM idempotency_keys WHERE id = :key_id AND lease_owner = :owner)
    AND EXISTS (SELECT 1 FROM o WHERE o.payment_intent_id = :pi)
  ON CONFLICT DO NOTHING RETURNING id)
SELECT (SELECT payment_intent_id FROM o) AS recorded, (SELECT id FROM c) AS confirm_id FROM sc \gset
-- Phase 3, after the confirm.
WITH a AS (UPDATE payment_attempts SET outcome = :succeeded,
    stripe_object_id = COALESCE(:pi, stripe_object_id), stripe_status = COALESCE(:succeeded, stripe_status),
    error = NULL, updated_at = :now
  WHERE id = :confirm_id),
f AS MATERIALIZED (SELECT id FROM idempotency_keys WHERE id = :key_id AND lease_owner = :owner AND recovery_point <> :rp_finished FOR UPDATE),
o AS (UPDATE orders SET status = :paid,
    payment_intent_id = COALESCE(NULLIF(:pi, ''), payment_intent_id),
    payment_status = COALESCE(NULLIF(:succeeded, ''), payment_status),
    payment_next_action = CASE WHEN :paid = 'requires_action' THEN NULL::jsonb ELSE payment_next_action END,
    payment_client_secret = CASE WHEN :paid = 'requires_action' THEN NULLIF(NULL, '') ELSE payment_client_secret END,
    payment_failure_code = NULLIF(NULL, ''),
    payment_decline_code = NULLIF(NULL, ''),
    requires_action_at = CASE WHEN :paid = 'requires_action' THEN :now ELSE requires_action_at END,
    payment_unknown_since = CASE WHEN :paid = 'payment_unknown' THEN payment_unknown_since ELSE NULL END,
    updated_at = :now
  WHERE id = :ord AND status IN (:pending, :payment_unknown, :requires_action) AND EXISTS (SELECT 1 FROM f) RETURNING id),
e AS (INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_seq, type, payload, occurred_at)
  SELECT :ev2, :tenant, :ord, s.n, :paid_event, (:payload_seq || s.n || '}')::json, :now
  FROM (SELECT outbox_next_seq(:ord) AS n) s WHERE EXISTS (SELECT 1 FROM o)),
k AS (UPDATE idempotency_keys
  SET recovery_point = :rp_finished, response_status = :status, response_headers = :headers, response_body = :body,
      lease_owner = NULL, lease_expires_at = NULL, finished_at = :now, updated_at = :now
  WHERE id = :key_id AND lease_owner = :owner AND recovery_point <> :rp_finished AND EXISTS (SELECT 1 FROM o) RETURNING expires_at)
SELECT (SELECT expires_at FROM k) AS finished_until;
