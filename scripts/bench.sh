#!/usr/bin/env bash
# The benchmark of record: the real binaries as separate processes, driven by
# wrk, against this machine's own limits measured in the same run (pgbench of
# the same SQL, a bare gin handler, raw RabbitMQ publishing). See
# tests/bench/main.go. Writes bench/results/latest.json and a dated copy.
# RUNS (5) runs, DUR (5) seconds per point; extra arguments go to tests/bench.
# BASELINE=<git revision>: also builds that revision's binaries and, in each
# run, times its 16-client checkout beside this build's (checkout_over_baseline).
# BASELINE_PATCH=<file>: applied to the baseline's source before it is built;
# BASELINE=HEAD BASELINE_PATCH=bench/fastpath-off.patch is this code with the
# checkout's fast path switched off, for what the fast path buys.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v wrk >/dev/null; then
  echo "bench: installing wrk" >&2
  if [ "$(id -u)" = 0 ]; then apt-get install -y wrk >/dev/null; else sudo apt-get install -y wrk >/dev/null; fi
fi
go build -o bin/ ./cmd/...
go build -o bin/bench ./tests/bench
extra=()
if [ -n "${BASELINE:-}" ]; then
  src=tmp/baseline-src
  rm -rf "$src" tmp/baseline-bin && mkdir -p "$src"
  git archive "$BASELINE" | tar -x -C "$src"
  if [ -n "${BASELINE_PATCH:-}" ]; then
    # Outside any repository, so that git apply patches the files in place.
    (cd "$src" && GIT_CEILING_DIRECTORIES="$PWD/.." git apply) <"$BASELINE_PATCH"
  fi
  (cd "$src" && go build -o ../baseline-bin/ ./cmd/...)
  export BENCH_BASELINE_REV
  BENCH_BASELINE_REV=$(git rev-parse --short "$BASELINE")${BASELINE_PATCH:+"+$(basename "$BASELINE_PATCH" .patch)"}
  extra=(-baseline tmp/baseline-bin)
fi
exec bin/bench -runs "${RUNS:-5}" -dur "${DUR:-5}s" "${extra[@]}" "$@"
