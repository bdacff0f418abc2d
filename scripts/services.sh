#!/usr/bin/env bash
# Starts PostgreSQL, Redis and RabbitMQ on this machine when they are down,
# with the commands of the machine's documentation, and waits for each.
set -euo pipefail

wait_for() { # name, command
  for _ in $(seq 1 60); do
    if eval "$2" >/dev/null 2>&1; then echo "$1 is up"; return 0; fi
    sleep 1
  done
  echo "$1 did not come up" >&2; return 1
}

# PgBouncer for make test-pgbouncer: the e2e stack starts its own
# (pgtest.StartPgBouncer); Debian's package only provides the binary.
if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
  echo "installing pgbouncer"
  apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >/dev/null
fi

if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
wait_for PostgreSQL "pg_isready -h 127.0.0.1 -p 5432"

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
wait_for Redis "redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG"

if ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
  echo "starting RabbitMQ"
  rabbitmq-server -detached || true
fi
wait_for RabbitMQ "rabbitmqctl -q status"
wait_for "RabbitMQ AMQP port" "(exec 3<>/dev/tcp/127.0.0.1/5672)"
