# Checkout service: see README.md.
SHELL := /bin/bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
BIN := bin
STRIPE_MOCK_VERSION := v0.203.0

.PHONY: all build test test-race fuzz lint tools run demo chaos bench services createdb clean

all: build

## build: compile every binary into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...

## tools: install stripe-mock (Stripe's official mock, used by one contract test)
tools: $(GOBIN)/stripe-mock
$(GOBIN)/stripe-mock:
	$(GO) install github.com/stripe/stripe-mock@$(STRIPE_MOCK_VERSION)

## test: every test, against the local PostgreSQL, Redis and RabbitMQ
test: tools lint
	PATH="$(GOBIN):$$PATH" $(GO) test -count=1 -timeout 9m ./...

## test-race: the same with the race detector (slower)
test-race: tools
	PATH="$(GOBIN):$$PATH" $(GO) test -count=1 -race -timeout 20m ./...

## fuzz: every fuzz target for FUZZTIME each (default 30s); CI runs them for 3s each
fuzz:
	FUZZTIME=$${FUZZTIME:-30s} ./scripts/fuzz.sh

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

## services: start PostgreSQL, Redis and RabbitMQ when they are down (this machine's packages)
services:
	./scripts/services.sh

# createdb's database: the one DATABASE_URL names (what make run's processes
# connect to), or the processes' default when DATABASE_URL is unset or empty.
# It is created through the same URL (user, password, host, port, query
# string) with the path set to the server's `postgres` database, less the
# query parameters only pgx knows (libpq refuses them). Parsed when the recipe
# is expanded, so that `make -n createdb` shows the name and the URL.
DEFAULT_DATABASE_URL := postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable
DB_URL = $(or $(value DATABASE_URL),$(DEFAULT_DATABASE_URL))
# db_url_part: the database's name (name) or the URL to create it through
# (maintenance), shell-quoted; empty when DB_URL is no postgres:// or
# postgresql:// URL with a database name (%XX-decoded, as libpq and pgx do).
define db_url_part
$(shell q() { printf "'%s'" "$${1//\'/\'\\\'\'}"; }; \
  u='$(subst ','\'',$(DB_URL))'; \
  [[ $$u =~ ^(postgres(ql)?://)([^/?#]*)(/([^?#]*))?(\?([^#]*))? ]] || exit 0; \
  base=$${BASH_REMATCH[1]}$${BASH_REMATCH[3]}; path=$${BASH_REMATCH[5]}; query=$${BASH_REMATCH[7]}; \
  path=$${path//\\/\\\\}; name=$$(printf '%b' "$${path//%/\\x}"); \
  [ -n "$$name" ] || exit 0; \
  keep=; IFS='&' read -ra params <<< "$$query"; \
  for p in "$${params[@]}"; do \
    case $${p%%=*} in \
      (pool_*|statement_cache_capacity|description_cache_capacity|default_query_exec_mode|prefer_simple_protocol|'') ;; \
      (*) keep+=$${keep:+&}$$p ;; \
    esac; \
  done; \
  case $(1) in (name) q "$$name" ;; (maintenance) q "$$base/postgres$${keep:+?$$keep}" ;; esac)
endef
DB_NAME = $(call db_url_part,name)
DB_MAINTENANCE = $(call db_url_part,maintenance)

## createdb: create the database DATABASE_URL names (default: checkout on 127.0.0.1) when it is missing
createdb:
	@$(if $(DB_NAME),,$(error DATABASE_URL is no postgres://[user[:password]@][host][:port]/name[?params] URL: create its database by hand))psql -d $(DB_MAINTENANCE) -tA -v name=$(DB_NAME) \
	  <<< "SELECT 1 FROM pg_database WHERE datname = :'name'" | grep -q 1 \
	  || createdb --maintenance-db=$(DB_MAINTENANCE) $(DB_NAME)

## run: the whole stack on this machine (Stripe emulator, SMTP sink, api, dispatcher, worker); Ctrl-C stops it
run: build createdb
	./scripts/run.sh

## demo: a scripted checkout against the running stack (make run in another terminal)
demo:
	./scripts/demo.sh

## chaos: N checkouts under random faults, then an invariant check (N=2000 by default)
chaos: build
	$(GO) run ./tests/chaos -n $${N:-2000}

## bench: the benchmark of record (real processes, wrk, pgbench, raw publish); RUNS=3 DUR=5
bench:
	./scripts/bench.sh

clean:
	rm -rf $(BIN) tmp
