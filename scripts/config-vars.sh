#!/usr/bin/env bash
# Prints, one per line, the names of the environment variables the
# processes read: env tags and getenv calls in the sources under cmd/ and
# internal/ (tests and the test harnesses aside, and TEST_* switches), so
# that a new variable is covered without a list to keep. scripts/run.sh
# carries these into the command that restarts a process by hand;
# internal/deploy's TestConfigVarsFindEveryEnvTag checks that the list
# holds every env tag of every settings struct.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -rhoE --include='*.go' --exclude='*_test.go' --exclude-dir={testenv,pgtest} \
  '(env:"|[gG]etenv\("|getenv, ")[A-Z][A-Z0-9_]*"' cmd internal |
  sed -E 's/.*"([A-Z][A-Z0-9_]*)"$/\1/' | grep -vE '^(TEST_.*|NAME)$' | sort -u
