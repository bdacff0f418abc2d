#!/usr/bin/env bash
# A scripted checkout against the running stack (make run): the order, a
# retry replayed, one event, one email; then a partial refund, its replay, a
# refund beyond what is left (409) and the refund email after the paid one; then a
# 3D Secure checkout settled by a webhook.
set -euo pipefail
API=${API:-http://127.0.0.1:8080}
SINK=${SINK:-http://127.0.0.1:8025}
KEY="demo-$(date +%s)-$RANDOM"
BODY='{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}'
post() {
  curl -sS -D - -X POST "$API/v1/checkouts" -H 'Authorization: Bearer sk_test_acme' \
    -H "Idempotency-Key: $KEY" -H 'Content-Type: application/json' -d "$1"
}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. POST /v1/checkouts with Idempotency-Key: $KEY"
first=$(post "$BODY"); echo "$first"
order=$(echo "$first" | grep -o '"id":"ord_[0-9a-f]*"' | head -n1 | cut -d'"' -f4)

step "2. The same request again (a client retry): same body, Idempotent-Replayed: true"
post "$BODY"; echo

step "3. The same key with another body: 422 idempotency_key_reused"
post '{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":3}],"payment_method":"pm_card_visa"}'; echo

step "4. Waiting for the email (outbox -> RabbitMQ -> worker -> SMTP)"
for _ in $(seq 1 50); do
  view=$(curl -sS "$API/v1/orders/$order" -H 'Authorization: Bearer sk_test_acme')
  echo "$view" | grep -q '"status":"sent"' && break
  sleep 0.2
done
echo "GET /v1/orders/$order"; echo "$view"

step "5. The events of the order in the outbox, published to RabbitMQ exactly as stored"
if command -v psql >/dev/null 2>&1 && psql "${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable}" -Atc 'SELECT 1' >/dev/null 2>&1; then
  psql "${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable}" -c \
    "SELECT id AS message_id, type AS routing_key, aggregate_seq AS sequence, published_at IS NOT NULL AS published, attempts AS failed_publishes FROM outbox WHERE aggregate_id = '$order' ORDER BY seq"
else
  echo "(no psql, or it cannot reach ${DATABASE_URL:-the default checkout database}: export the stack's DATABASE_URL here;"
  echo " meanwhile see the dispatcher's checkout_outbox_published_total at http://127.0.0.1:9091/metrics)"
fi

step "6. Emails in the SMTP sink for this order (expect exactly 1)"
if msgs=$(curl -fsS "$SINK/messages" 2>/dev/null); then            # make run: cmd/smtp-sink
  n=$(echo "$msgs" | grep -o "\"subject\":\"Your order $order is paid\"" | wc -l)
else                                                             # docker compose: mailpit
  n=$(curl -fsS "$SINK/api/v1/search?query=$order" | grep -o '"messages_count":[0-9]*' | cut -d: -f2)
fi
echo "emails for $order: $n"
[ "$n" = 1 ]

RKEY="refund-$KEY"
refund() {
  curl -sS -D - -X POST "$API/v1/orders/$order/refunds" -H 'Authorization: Bearer sk_test_acme' \
    -H "Idempotency-Key: $1" -H 'Content-Type: application/json' -d "$2"
}

step "7. POST /v1/orders/$order/refunds: a partial refund of 15.00 (Idempotency-Key: $RKEY)"
refund "$RKEY" '{"amount":1500,"reason":"requested_by_customer"}'; echo

step "8. The same refund again (a client retry): the same 201, Idempotent-Replayed: true, still one refund at Stripe"
refund "$RKEY" '{"amount":1500,"reason":"requested_by_customer"}'; echo

step "9. A refund of 40.00 when 35.00 is left: 409 refund_exceeds_payment (stored under its key)"
refund "$RKEY-too-much" '{"amount":4000}'; echo

step "10. Waiting for the refund email (order.refunded, sequenced after order.paid)"
for _ in $(seq 1 50); do
  view=$(curl -sS "$API/v1/orders/$order" -H 'Authorization: Bearer sk_test_acme')
  [ "$(echo "$view" | grep -o '"status":"sent"' | wc -l)" -ge 2 ] && break
  sleep 0.2
done
echo "GET /v1/orders/$order"; echo "$view"

step "11. Emails for this order, in the order the SMTP sink accepted them (expect: paid, then refund)"
if msgs=$(curl -fsS "$SINK/messages" 2>/dev/null); then
  echo "$msgs" | grep -o "\"subject\":\"Your [a-z]* [a-z ]*${order}[a-z ]*\"" | cut -d'"' -f4
  r=$(echo "$msgs" | grep -o "\"subject\":\"Your refund for order $order\"" | wc -l)
else
  r=$(curl -fsS "$SINK/api/v1/search?query=refund+$order" | grep -o '"messages_count":[0-9]*' | cut -d: -f2)
fi
echo "refund emails for $order: $r"
[ "$r" = 1 ]

step "12. 3D Secure: 202 requires_action, the customer's challenge, settled by Stripe's webhook"
EMU=${EMU:-http://127.0.0.1:12111}
KEY="demo-3ds-$(date +%s)-$RANDOM"
r=$(post '{"email":"buyer@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_authenticationRequired"}')
echo "$r" | head -n1
order3=$(echo "$r" | grep -o '"id":"ord_[0-9a-f]*"' | head -n1 | cut -d'"' -f4)
pi=$(echo "$r" | grep -o '"payment_intent_id":"pi_[A-Za-z0-9]*"' | head -n1 | cut -d'"' -f4)
echo "order $order3 is requires_action; PaymentIntent $pi waits for the customer"
curl -fsS -o /dev/null -X POST "$EMU/_emulator/payment_intents/$pi/authenticate" -d '{"outcome":"succeed"}'
t0=$(date +%s%N)
status=
for _ in $(seq 1 100); do
  status=$(curl -sS "$API/v1/orders/$order3" -H 'Authorization: Bearer sk_test_acme' | grep -o '"status":"[a-z_]*"' | head -n1 | cut -d'"' -f4)
  [ "$status" = paid ] && break
  sleep 0.05
done
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "challenge passed at Stripe; order $order3 is $status ${ms}ms later (the reconciler polls every 10s: this was the webhook)"
curl -sS "$API/metrics" | grep '^checkout_stripe_webhooks_total{.*payment_intent.succeeded' || true
[ "$status" = paid ]
