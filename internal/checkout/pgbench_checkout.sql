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
SELECT * FROM "products" WHERE sku IN (:sku);
SAVEPOINT before_order;
INSERT INTO "orders" ("id","tenant_id","status","email","currency","amount_total","payment_method","payment_intent_id","payment_status","created_at","updated_at")
VALUES (:ord,:tenant,:pending,:email,:currency,:amount,:pm,NULL,NULL,:now,:now);
INSERT INTO "order_items" ("order_id","line","sku","quantity","unit_amount","amount")
VALUES (:ord,:line,:sku,:qty,:amount,:amount) ON CONFLICT ("order_id","line") DO UPDATE SET "order_id"="excluded"."order_id";
INSERT INTO outbox (id, tenant_id, aggregate_id, type, payload, occurred_at)
VALUES (:ev1, :tenant, :ord, :created, :payload, :now);
UPDATE idempotency_keys SET recovery_point = :rp_order_created, order_id = :ord, updated_at = :now
WHERE id = :id AND lease_owner = :owner AND recovery_point <> :rp_finished;
UPDATE products SET stock = stock - :qty WHERE sku = :sku AND stock >= :qty;
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
VALUES (:ev2, :tenant, :ord, :paid_event, :payload, :now);
COMMIT;
