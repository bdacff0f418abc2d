#!/usr/bin/env bash
# Benchmarks reported against this machine's own limits, measured in the same
# run: pgbench (TPC-B-like, the database's transaction rate) for checkouts,
# and the raw confirmed publish rate of RabbitMQ for the outbox relay.
set -euo pipefail
cd "$(dirname "$0")/.."
PGURL_ADMIN=${PGURL_ADMIN:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
DUR=${DUR:-10}
out=$(mktemp -d)

db=bench_pgbench_$$
psql "$PGURL_ADMIN" -qc "CREATE DATABASE $db" >/dev/null
trap 'psql "$PGURL_ADMIN" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null; rm -rf "$out"' EXIT
pgurl="postgres://postgres@127.0.0.1:5432/$db?sslmode=disable"
pgbench -q -i -s 10 "$pgurl" >/dev/null 2>&1
echo "pgbench: TPC-B-like, 16 clients, ${DUR}s"
pgbench -c 16 -j 2 -T "$DUR" "$pgurl" 2>/dev/null | tee "$out/pgbench" | grep -E "^tps" || true
pg_tps=$(grep -E "^tps" "$out/pgbench" | head -n1 | sed -E 's/tps = ([0-9.]+).*/\1/')

echo "go benchmarks (${DUR}s each)"
go test -run '^$' -bench 'Checkout|Publish|Relay' -benchtime "${DUR}s" \
  ./internal/api ./internal/outbox ./internal/rabbitmq 2>&1 | tee "$out/go" | grep -E "^Benchmark" || true

metric() { grep -E "^$1" "$out/go" | grep -oE "[0-9.]+ $2" | head -n1 | cut -d' ' -f1; }
new=$(metric BenchmarkCheckoutNew checkouts/s)
replay=$(metric BenchmarkCheckoutReplay replays/s)
raw=$(metric BenchmarkRawPublish msgs/s || true)
relay=$(metric BenchmarkRelay events/s || true)
ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}' || echo "n/a"; }

echo
echo "| measure | rate | machine limit (same run) | ratio |"
echo "|---|---|---|---|"
echo "| checkout, first execution (2 transactions + Stripe emulator) | ${new:-?}/s | pgbench ${pg_tps:-?} tps | $(ratio "$new" "$pg_tps") |"
echo "| checkout, replay from Redis | ${replay:-?}/s | pgbench ${pg_tps:-?} tps | $(ratio "$replay" "$pg_tps") |"
echo "| outbox relay, published and marked | ${relay:-?}/s | raw confirmed publish ${raw:-?}/s | $(ratio "$relay" "$raw") |"
