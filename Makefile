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

## createdb: create the database DATABASE_URL names (default: checkout on 127.0.0.1) when it is missing
createdb:
	@$(GO) run ./scripts/createdb

## run: the whole stack on this machine (Stripe emulator, SMTP sink, api, dispatcher, worker); Ctrl-C stops it
run: build createdb
	./scripts/run.sh

## demo: the Go client against the running stack (make run, or docker compose up)
demo:
	$(GO) run ./cmd/demo

## chaos: N checkouts under random faults and a mail outage, then an invariant check (N=2000, MAIL_OUTAGE=5m by default)
chaos: build
	$(GO) run ./tests/chaos -n $${N:-2000} -mail-outage $${MAIL_OUTAGE:-5m}

## bench: the benchmark of record (real processes, wrk, pgbench, raw publish); RUNS=5 DUR=5 [BASELINE=rev]
bench:
	./scripts/bench.sh

clean:
	rm -rf $(BIN) tmp
