#!/usr/bin/env bash
# Runs every fuzz target of the module (each func FuzzXxx in a _test.go file)
# for FUZZTIME each (default 30s), one target at a time, with FUZZ_PARALLEL
# workers (default 1: the machine is small and the targets share Postgres
# and Redis). A failing input is written to the package's testdata/fuzz/
# directory by go test: commit it, and it runs as a regression test in every
# `go test` from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-30s}
FUZZ_PARALLEL=${FUZZ_PARALLEL:-1}
# Bounds the minimization of each new input (go test's default is 60s, which
# with a slow target such as FuzzCheckout stalls the search).
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-5s}

start=$SECONDS
count=0
for dir in $(git ls-files '*_test.go' | xargs grep -l '^func Fuzz' | xargs -n1 dirname | sort -u); do
  for target in $(grep -h -o '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go | sed 's/^func //' | sort); do
    echo "fuzz: $target in ./$dir for $FUZZTIME"
    # Go 1.26's fuzzing coordinator can fail a target with a bare "context
    # deadline exceeded" when -fuzztime ends, having found nothing
    # (https://go.dev/issue/75804, fixed in Go 1.27). Such a run, which
    # wrote no failing input, is run once more; a real finding fails.
    for try in 1 2; do
      out=$(mktemp)
      if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" \
        -parallel "$FUZZ_PARALLEL" "./$dir" 2>&1 | tee "$out"; then
        rm -f "$out"
        break
      fi
      if [ "$try" = 1 ] && grep -qx $'\tcontext deadline exceeded\|    context deadline exceeded' "$out" &&
        [ -z "$(git status --porcelain -- "$dir/testdata/fuzz")" ]; then
        echo "fuzz: $target: the coordinator's deadline race (go.dev/issue/75804), no input written; once more"
        rm -f "$out"
        continue
      fi
      rm -f "$out"
      exit 1
    done
    count=$((count + 1))
  done
done
echo "fuzz: $count targets, $((SECONDS - start))s"
