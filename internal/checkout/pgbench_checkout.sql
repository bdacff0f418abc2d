-- The SQL of one paid checkout, as the service sends it (transaction 1 in
-- service.go createOrder and store.go, the key store in
-- internal/idempotency/store.go, transaction 2 in service.go pay), for
-- pgbench: `make bench` runs it as the database's limit for this work.
-- internal/api's TestPgbenchCheckoutScriptMirrorsTheCode fails when the code's
-- statements change and this script does not. The Stripe call between the
-- two transactions is not SQL and is left out. The constants (-D) are set by
-- tests/bench; each checkout gets new random keys and ids.
\set key random(1, 9000000000000000000)
\set ord random(1, 9000000000000000000)
\set ev1 random(1, 9000000000000000000)
\set ev2 random(1, 9000000000000000000)
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
e AS (INSERT INTO outbox (id, tenant_id, aggregate_id, type, payload, occurred_at)
  SELECT :ev1, :tenant, :ord, :created, :payload::json, :now::timestamptz WHERE EXISTS (SELECT 1 FROM o)),
k AS (UPDATE idempotency_keys SET recovery_point = :rp_order_created, order_id = :ord, updated_at = :now
  WHERE id = :id AND lease_owner = :owner AND recovery_point <> :rp_finished AND EXISTS (SELECT 1 FROM o) RETURNING id)
SELECT r.ok AS reserved, (SELECT count(*) FROM k) AS advanced FROM r;
COMMIT;
BEGIN;
UPDATE idempotency_keys
SET recovery_point = :rp_finished, response_status = :status, response_headers = :headers, response_body = :body,
    lease_owner = NULL, lease_expires_at = NULL, finished_at = :now, updated_at = :now
WHERE id = :id AND lease_owner = :owner AND recovery_point <> :rp_finished
RETURNING expires_at;
UPDATE orders SET status = :paid, payment_intent_id = :pi, payment_status = :succeeded, updated_at = :now
WHERE id = :ord AND status = :pending;
INSERT INTO outbox (id, tenant_id, aggregate_id, type, payload, occurred_at)
SELECT :ev2, :tenant, :ord, :paid_event, :payload::json, :now::timestamptz;
COMMIT;
