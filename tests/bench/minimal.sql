-- A minimal durable checkout, for pgbench: one transaction that claims a key,
-- inserts an order and its event, and commits, on the service's own schema
-- (its indexes and triggers included). What no checkout can beat on this
-- database; `make bench` divides the checkout SQL's rate by it.
\set key random(1, 9000000000000000000)
\set ord random(1, 9000000000000000000)
\set ev random(1, 9000000000000000000)
BEGIN;
INSERT INTO idempotency_keys (tenant_id, route, key, fingerprint, recovery_point, order_id, created_at, updated_at, expires_at)
VALUES (:tenant, :route, :key, :fingerprint, :rp_order_created, :ord, :now, :now, :expires);
INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
VALUES (:ord, :tenant, :pending, :email, :currency, :amount, :pm, :now, :now);
INSERT INTO outbox (id, tenant_id, aggregate_id, type, payload, occurred_at)
VALUES (:ev, :tenant, :ord, :created, :payload, :now);
COMMIT;
