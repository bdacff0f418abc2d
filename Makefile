# Checkout service: see README.md.
SHELL := /bin/bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
BIN := bin
STRIPE_MOCK_VERSION := v0.203.0
# staticcheck v0.8.2 (2026.2.2): a release built for the go1.26 this module uses.
STATICCHECK_VERSION := v0.8.2

.PHONY: all build test test-model test-model-long test-failover test-pgbouncer test-k8s test-trace test-race fuzz lint tools run demo chaos bench services createdb dropdb clean

all: build

## build: compile every binary into ./bin
build:
	$(GO) build -o $(BIN)/ ./cmd/...

## tools: install stripe-mock (Stripe's official mock, used by one contract test) and staticcheck
tools: $(GOBIN)/stripe-mock $(GOBIN)/staticcheck
$(GOBIN)/stripe-mock:
	$(GO) install github.com/stripe/stripe-mock@$(STRIPE_MOCK_VERSION)
# Reinstalled when the version it reports is not STATICCHECK_VERSION.
$(GOBIN)/staticcheck: Makefile
	@if ! $(GOBIN)/staticcheck -version 2>/dev/null | grep -qF '($(STATICCHECK_VERSION:v%=%))'; then \
		echo $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); \
	fi

## test: every test, against the local PostgreSQL, Redis and RabbitMQ
test: tools lint
	PATH="$(GOBIN):$$PATH" $(GO) test -count=1 -timeout 9m ./...

## test-failover: the failover tests, on clusters of real servers started on this machine
## (TEST_FAILOVER=1; PostgreSQL: a primary and a synchronous standby; RabbitMQ: 3 nodes;
## Redis Cluster and Sentinel); make test skips them
test-failover:
	TEST_FAILOVER=1 $(GO) test -count=1 -p 1 -timeout 25m -run 'TestCluster$$|TestRabbitMQNodeAndLeaderLoss|TestFailoverToSynchronousStandby|TestRedisMasterFailover' \
		-v ./internal/rabbitmq/rabbitmqtest ./tests/e2e

## test-model: the model test (tests/model, build tag model): CHECKS generated histories of about
## STEPS actions from SEED against the real processes, and the defects' shrunk histories
## (TestHistory*); a failure prints its shrunk history as a Go test (docs/testing.md). The
## defaults fit in under 10 minutes on this 2-core machine
test-model:
	$(GO) vet -tags model ./tests/model
	$(GO) test -tags model -count=1 -timeout 20m -run 'TestModel$$|TestHistory' ./tests/model \
		-rapid.seed=$${SEED:-1} -rapid.checks=$${CHECKS:-5} -rapid.steps=$${STEPS:-15} -rapid.shrinktime=$${SHRINKTIME:-2m}

## test-model-long: the same with a larger budget (about an hour here), and a random seed unless SEED is set
test-model-long:
	$(GO) test -tags model -count=1 -timeout 120m -run 'TestModel$$' ./tests/model \
		-rapid.seed=$${SEED:-0} -rapid.checks=$${CHECKS:-40} -rapid.steps=$${STEPS:-40} -rapid.shrinktime=$${SHRINKTIME:-10m}

## test-pgbouncer: the e2e suite with every process behind PgBouncer in transaction pooling
test-pgbouncer:
	E2E_PGBOUNCER=1 $(GO) test -count=1 -timeout 20m ./tests/e2e

## test-k8s: deploy/k8s applied to a real kube-apiserver and etcd (tests/k8sapply), both overlays,
## install then upgrade; the two servers are built once from the Go module proxy, at the release
## tests/k8sapply/go.mod pins, into K8S_BIN_DIR (a first build takes many CPU-minutes)
K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" { print $$2 }' tests/k8sapply/go.mod)
K8S_BIN_DIR ?= $(GOBIN)/k8s-$(K8S_VERSION)
test-k8s: $(K8S_BIN_DIR)/kube-apiserver
	cd tests/k8sapply && K8S_BIN_DIR=$(K8S_BIN_DIR) $(GO) test -count=1 -timeout 10m ./...
$(K8S_BIN_DIR)/kube-apiserver:
	cd tests/k8sapply && $(GO) build -trimpath -o $(K8S_BIN_DIR)/ k8s.io/kubernetes/cmd/kube-apiserver go.etcd.io/etcd/server/v3

## test-trace: the e2e trace test (one trace from the POST to the SMTP send; also in make test)
## 5 times over, for a change to the tracing
test-trace:
	$(GO) test -count=5 -timeout 10m -run 'TestOneTraceFromPostToSMTPSend' ./tests/e2e

## test-race: the same with the race detector (slower)
test-race: tools
	PATH="$(GOBIN):$$PATH" $(GO) test -count=1 -race -timeout 20m ./...

## fuzz: every fuzz target for FUZZTIME each (default 30s); CI runs them for 3s each
fuzz:
	FUZZTIME=$${FUZZTIME:-30s} ./scripts/fuzz.sh

## lint: gofmt, go vet, staticcheck, and go.mod/go.sum exactly as go mod tidy leaves them
lint: $(GOBIN)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...
	$(GO) mod tidy -diff

## services: start PostgreSQL, Redis and RabbitMQ when they are down (this machine's packages)
services:
	./scripts/services.sh

## createdb: create the database DATABASE_URL names (default: checkout on 127.0.0.1) when it is missing
createdb:
	@$(GO) run ./scripts/createdb

## dropdb: drop the database DATABASE_URL names (make run's; stop make run first)
dropdb:
	@$(GO) run ./scripts/createdb -drop

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
