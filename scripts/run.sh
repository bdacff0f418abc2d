#!/usr/bin/env bash
# Runs the whole stack on this machine against the local PostgreSQL, Redis and
# RabbitMQ: the Stripe emulator (:12111), an SMTP sink (:1025, messages at
# http://127.0.0.1:8025/messages), the api (:8080), the dispatcher (:9091),
# the worker (:9092) and the storefront (http://127.0.0.1:8081). Logs go to
# tmp/<name>.log and, prefixed, here. PORT_OFFSET=N adds N to each of those
# ports, for a second stack beside the first on one machine (give it names
# of its own on the shared services too: README, "Run it"). The ports are on
# 127.0.0.1 only (nothing there asks for a password: the api's development
# keys, the emulator's fault endpoint); CHECKOUT_HOST_IP=0.0.0.0 puts them on
# every interface, as it does for docker compose.
# `scripts/run.sh --plan` prints what it would start, and the demo line, and
# starts nothing.
# Ctrl-C (or SIGTERM, or SIGHUP) stops everything: each process runs in a
# session of its own, out of the terminal's reach, and this script alone stops
# them. A process that dies (kill -9 it to see a crash recovered) leaves the
# others running; restart it by hand with the command printed, which carries
# the configuration the stack was started with, and the emulator and the SMTP
# sink keep their state.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mkdir -p tmp
pids=()
declare -A names
if [[ $(trap -p INT) == "trap -- '' SIGINT" ]]; then
  # Started as a background job: SIGINT cannot be trapped, and never reaches
  # the processes, which run in sessions of their own.
  echo "[run] SIGINT is ignored here (a background job?): stop the stack with kill $$" >&2
fi
stop() { # name...: SIGTERM to these processes (also those restarted by hand), then wait until they are gone
  local name pid
  for name in "$@"; do
    for pid in "${pids[@]}"; do [ "${names[$pid]}" = "$name" ] && kill -TERM "$pid" 2>/dev/null; done
    pkill -TERM -f "^$root/bin/$name\$" 2>/dev/null || true
  done
  for name in "$@"; do
    for pid in "${pids[@]}"; do [ "${names[$pid]}" = "$name" ] && { wait "$pid" 2>/dev/null || true; }; done
    # Processes restarted by hand are no children of this script: poll.
    for _ in $(seq 1 300); do pgrep -f "^$root/bin/$name\$" >/dev/null || break; sleep 0.1; done
  done
}
cleanup() { # exit status
  trap - INT TERM HUP EXIT
  echo "stopping..." 2>/dev/null || true   # (the terminal may be gone: SIGHUP)
  # The api, the dispatcher and the worker first: they finish what is in
  # flight (SHUTDOWN_TIMEOUT) while the Stripe emulator and the SMTP sink still
  # answer them; then those two.
  stop storefront api dispatcher worker
  stop stripe-emulator smtp-sink
  wait 2>/dev/null || true
  # Never back to the loop below: a process that exits from here on is being
  # stopped, and gets no "restart it" hint.
  exit "$1"
}
# Ctrl-C, SIGTERM and SIGHUP are how the stack is meant to stop: status 0
# (so make does not report the Ctrl-C as an error).
trap 'cleanup 0' INT TERM HUP
trap 'cleanup $?' EXIT

start() { # name, binary
  # setsid: its own session and process group, so a Ctrl-C in this terminal
  # reaches this script only (which stops the stack) and not the process
  # (whose exit would look like a crash). setsid forks only when it leads a
  # process group, which a job of this script (no job control) never does: $!
  # is the process itself.
  # The log pipe ignores the terminal's signals too: were it killed by the
  # Ctrl-C, the process would die of SIGPIPE at its next log line instead of
  # draining. tee goes on writing the file if the terminal goes (SIGHUP).
  # shellcheck disable=SC2086 # own_env is assignments, one word each
  setsid env ${own_env[$1]} "$root/bin/$2" > >(trap '' INT HUP PIPE; tee --output-error=warn-nopipe -a "tmp/$1.log" | sed -u "s/^/[$1] /") 2>&1 &
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

# The stack's ports: each process's default, plus PORT_OFFSET.
offset=${PORT_OFFSET:-0}
if ! [[ $offset =~ ^[0-9]{1,5}$ ]] || (( offset > 50000 )); then
  echo "[run] PORT_OFFSET=$offset: want a whole number from 0 to 50000" >&2
  exit 2
fi
# Where the processes listen (bind) and where they and the demo reach each
# other (reach): an address of every interface is reached on loopback.
host_ip=${CHECKOUT_HOST_IP:-127.0.0.1}
bind=$host_ip reach=$host_ip
[[ $host_ip == *:* ]] && bind="[$host_ip]" reach="[$host_ip]"
[[ $host_ip == 0.0.0.0 || $host_ip == :: ]] && reach=127.0.0.1
emu_port=$((12111 + offset)) smtp_port=$((1025 + offset)) sink_port=$((8025 + offset))
api_port=$((8080 + offset)) dispatcher_port=$((9091 + offset)) worker_port=$((9092 + offset))
shop_port=$((8081 + offset))
# What each process alone is given (the dispatcher and the worker both read
# METRICS_ADDR); everything else is the environment they share. A user's
# STRIPE_API_BASE (Stripe's test mode) or SMTP_ADDR (a mail catcher of their
# own) is kept.
declare -A own_env=(
  [stripe-emulator]="STRIPE_EMULATOR_ADDR=$bind:$emu_port"
  [smtp-sink]="SMTP_SINK_ADDR=127.0.0.1:$smtp_port SMTP_SINK_HTTP_ADDR=$bind:$sink_port"
  [api]="HTTP_ADDR=$bind:$api_port"
  [dispatcher]="METRICS_ADDR=$bind:$dispatcher_port"
  [worker]="METRICS_ADDR=$bind:$worker_port"
  [storefront]="STOREFRONT_ADDR=$bind:$shop_port API_URL=http://$reach:$api_port"
)
export STRIPE_API_BASE=${STRIPE_API_BASE:-http://$reach:$emu_port}
export SMTP_ADDR=${SMTP_ADDR:-127.0.0.1:$smtp_port}

# The emulator delivers its signed webhooks to the api (POST
# /v1/webhooks/stripe); both use the same signing secret.
export STRIPE_WEBHOOK_SECRET=${STRIPE_WEBHOOK_SECRET:-whsec_test_checkout}
export STRIPE_EMULATOR_WEBHOOK_URL=${STRIPE_EMULATOR_WEBHOOK_URL:-http://$reach:$api_port/v1/webhooks/stripe}

# The command that restarts a process by hand runs in another terminal, which
# has none of this environment: it carries every configuration variable set
# (not empty) here, the ones exported above and the user's (DATABASE_URL,
# REDIS_KEY_PREFIX, AMQP_EXCHANGE, NOTIFY_QUEUE, ports, ...). Their names are
# the ones the processes read (scripts/config-vars.sh finds them in the
# sources, so that a new variable is covered), and libpq's PG* ones, which pgx reads for what DATABASE_URL leaves
# out. Every process gets this same environment.
shq() { # $1 as one word for any POSIX shell: as is when safe, else in single quotes
  if [[ $1 =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}
declare -A config_var
while read -r var; do config_var[$var]=1; done < <("$root/scripts/config-vars.sh")
restart_env=
while read -r var; do
  if [[ -n ${config_var[$var]:-} || $var =~ ^PG[A-Z_]+$ ]] && [ -n "${!var}" ]; then
    restart_env+="$var=$(shq "${!var}") "
  fi
done < <(compgen -e | sort)
# The demo line for another terminal: the stack's addresses when they are not
# the demo's defaults, and the database the stack uses (DATABASE_URL and
# libpq's PG* variables, which the demo's pgx reads too) when set: without
# them the demo reads the outbox of another database.
demo_env=
if (( offset > 0 )) || [ "$reach" != 127.0.0.1 ]; then
  demo_env="API=http://$reach:$api_port SINK=http://$reach:$sink_port EMU=http://$reach:$emu_port "
fi
while read -r var; do
  if [[ $var == DATABASE_URL || $var =~ ^PG[A-Z_]+$ ]] && [ -n "${!var}" ]; then
    demo_env+="$var=$(shq "${!var}") "
  fi
done < <(compgen -e | sort)
demo="${demo_env}make demo"
if [ "${1:-}" = --plan ]; then
  trap - INT TERM HUP EXIT # nothing started, nothing to stop
  for name in stripe-emulator smtp-sink api dispatcher worker storefront; do
    echo "[plan] $name: env ${restart_env}${own_env[$name]} $root/bin/$name"
  done
  echo "[plan] demo: $demo"
  exit 0
fi
start stripe-emulator stripe-emulator
start smtp-sink smtp-sink
wait_http stripe-emulator "http://$reach:$emu_port/healthz"
start api api
wait_http api "http://$reach:$api_port/readyz"   # the api applies the migrations (MIGRATE_ON_START)
start dispatcher dispatcher
start worker worker
wait_http dispatcher "http://$reach:$dispatcher_port/readyz"
wait_http worker "http://$reach:$worker_port/readyz"
start storefront storefront
wait_http storefront "http://$reach:$shop_port/healthz"
cat <<MSG
[run] stack is up. Shop at http://$reach:$shop_port (the emails it sends: http://$reach:$sink_port/messages).
Or try, in another terminal:
  $demo
  curl -si -X POST $reach:$api_port/v1/checkouts -H 'Authorization: Bearer sk_test_acme' \\
    -H 'Idempotency-Key: my-first-key' -H 'Content-Type: application/json' \\
    -d '{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}'
MSG
while true; do
  gone=
  set +e
  wait -n -p gone "${pids[@]}"
  code=$?
  set -e
  [ -z "${gone:-}" ] && break
  name=${names[$gone]}
  echo "[run] $name exited (status $code); the rest keeps running. Restart it, in another terminal, with:" >&2
  # setsid -f: detached at once, so the process is no job of that shell
  # (a later `wait` there would block on it) and outlives the terminal.
  echo "[run]   env ${restart_env}${own_env[$name]} setsid -f $(shq "$root/bin/$name") >> $(shq "$root/tmp/$name.log") 2>&1 < /dev/null" >&2
  echo "[run] (its log then goes to tmp/$name.log only; Ctrl-C here still stops it)" >&2
  left=()
  for pid in "${pids[@]}"; do [ "$pid" != "$gone" ] && left+=("$pid"); done
  pids=("${left[@]}")
  [ ${#pids[@]} -eq 0 ] && break
done
