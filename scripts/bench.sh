#!/usr/bin/env bash
# The benchmark of record: the real binaries as separate processes, driven by
# wrk, against this machine's own limits measured in the same run (pgbench of
# the same SQL, a bare gin handler, raw RabbitMQ publishing). See
# tests/bench/main.go. Writes bench/results/latest.json and a dated copy.
# RUNS (3) runs, DUR (5) seconds per point; extra arguments go to tests/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v wrk >/dev/null; then
  echo "bench: installing wrk" >&2
  if [ "$(id -u)" = 0 ]; then apt-get install -y wrk >/dev/null; else sudo apt-get install -y wrk >/dev/null; fi
fi
go build -o bin/ ./cmd/...
go build -o bin/bench ./tests/bench
exec bin/bench -runs "${RUNS:-3}" -dur "${DUR:-5}s" "$@"
