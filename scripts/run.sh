#!/usr/bin/env bash
# Runs the whole stack on this machine against the local PostgreSQL, Redis and
# RabbitMQ: the Stripe emulator (:12111), an SMTP sink (:1025, messages at
# http://127.0.0.1:8025/messages), the api (:8080), the dispatcher (:9091)
# and the worker (:9092). Logs go to tmp/<name>.log and, prefixed, here.
# Ctrl-C (or SIGTERM) stops everything. A process that dies (kill -9 it to
# see a crash recovered) leaves the others running; restart it by hand with
# the command printed, and the emulator and the SMTP sink keep their state.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mkdir -p tmp
pids=()
declare -A names
cleanup() {
  trap - INT TERM EXIT
  echo "stopping..."
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # Also the processes restarted by hand with the command printed below.
  pkill -TERM -f "^$root/bin/(stripe-emulator|smtp-sink|api|dispatcher|worker)\$" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

start() { # name, binary
  "$root/bin/$2" > >(tee -a "tmp/$1.log" | sed -u "s/^/[$1] /") 2>&1 &
  pids+=($!)
  names[$!]=$1
}
wait_http() { # name, url
  for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "$2" 2>/dev/null && { echo "[run] $1 ready"; return 0; }
    sleep 0.2
  done
  echo "[run] $1 did not become ready at $2" >&2; exit 1
}

# The emulator delivers its signed webhooks to the api (POST
# /v1/webhooks/stripe); both use the same signing secret.
export STRIPE_WEBHOOK_SECRET=${STRIPE_WEBHOOK_SECRET:-whsec_test_checkout}
export STRIPE_EMULATOR_WEBHOOK_URL=${STRIPE_EMULATOR_WEBHOOK_URL:-http://127.0.0.1:8080/v1/webhooks/stripe}
start stripe-emulator stripe-emulator
start smtp-sink smtp-sink
wait_http stripe-emulator http://127.0.0.1:12111/healthz
start api api
wait_http api http://127.0.0.1:8080/readyz   # the api applies the migrations
start dispatcher dispatcher
start worker worker
wait_http dispatcher http://127.0.0.1:9091/readyz
wait_http worker http://127.0.0.1:9092/readyz
cat <<'MSG'
[run] stack is up. Try, in another terminal:
  make demo
  curl -si -X POST localhost:8080/v1/checkouts -H 'Authorization: Bearer sk_test_acme' \
    -H 'Idempotency-Key: my-first-key' -H 'Content-Type: application/json' \
    -d '{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}'
MSG
while true; do
  set +e
  wait -n -p gone "${pids[@]}"
  code=$?
  set -e
  [ -z "${gone:-}" ] && break
  name=${names[$gone]}
  echo "[run] $name exited (status $code); the rest keeps running. Restart it, in another terminal, with:" >&2
  # setsid -f: detached at once, so the process is no job of that shell
  # (a later `wait` there would block on it) and outlives the terminal.
  echo "[run]   setsid -f $root/bin/$name >> $root/tmp/$name.log 2>&1 < /dev/null" >&2
  echo "[run] (its log then goes to tmp/$name.log only; Ctrl-C here still stops it)" >&2
  left=()
  for pid in "${pids[@]}"; do [ "$pid" != "$gone" ] && left+=("$pid"); done
  pids=("${left[@]}")
  [ ${#pids[@]} -eq 0 ] && break
done
