//go:build model

// Package model is the model-based test of CONTRACT.md: generated
// histories (pgregory.net/rapid state machines) of checkouts, retries,
// cancels, refunds, Stripe faults, Dashboard actions, crashes and time
// passing, run against the real api, worker and dispatcher processes on the
// real PostgreSQL, Redis and RabbitMQ with the Stripe emulator and the SMTP
// sink (package tests/e2e/stack), and the money rules checked after every
// step and at quiescence. A failure shrinks to a minimal history, printed
// as a Go test to paste into this package (docs/testing.md, "The model
// test").
package model

import (
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/onceonly/checkout/tests/e2e/stack"
)

// binDir holds the binaries, built once for the whole package.
var binDir string

func TestMain(m *testing.M) { stack.Main(m, "model", &binDir) }

// The windows every process runs with, short so that a history can let
// each of them pass (action passTime). They keep the defaults' order:
// REFUND_RETRY_AFTER equals IDEMPOTENCY_TTL as both are 24h by default, and
// PAYMENT_UNKNOWN_AFTER and PAYMENT_ACTION_TIMEOUT are shorter than the TTL
// as 1h and 30m are shorter than 24h.
const (
	lease         = time.Second
	ttl           = 4 * time.Second
	actionTimeout = 2 * time.Second
	unknownAfter  = 2 * time.Second
	refundRetry   = 4 * time.Second
	notifyRetry   = 5 * time.Second
)

// windows are the durations action passTime lets pass, by the variable
// they stand for.
var windows = []struct {
	name string
	d    time.Duration
}{
	{"IDEMPOTENCY_LEASE", lease},
	{"IDEMPOTENCY_TTL", ttl},
	{"PAYMENT_ACTION_TIMEOUT", actionTimeout},
	{"PAYMENT_UNKNOWN_AFTER", unknownAfter},
	{"REFUND_RETRY_AFTER", refundRetry},
	{"NOTIFY_RETRY_FOR", notifyRetry},
}

// startStack starts the stack a test's histories share: one per top-level
// test, as starting five processes per history would cost more than the
// histories themselves. Histories stay independent through fresh keys and
// emails (history.prefix) and a reset of every fault at their start.
func startStack(t *testing.T) *stack.Stack {
	t.Helper()
	both := map[string]string{
		"PAYMENT_ACTION_TIMEOUT": actionTimeout.String(),
		"PAYMENT_UNKNOWN_AFTER":  unknownAfter.String(),
		"REFUND_RETRY_AFTER":     refundRetry.String(),
		"WORK_TIMEOUT":           "8s",
	}
	worker := map[string]string{
		"NOTIFY_RETRY_FOR":          notifyRetry.String(),
		"NOTIFY_RETRY_MAX_INTERVAL": "500ms",
		// An event that came before its order's previous one (a
		// restart hands deliveries back out of order) waits this long
		// for it: 30s by default, more than quiesce waits.
		"NOTIFY_SEQUENCE_WAIT": "1s",
		"COMPLETER_INTERVAL":   "300ms",
		"REAPER_INTERVAL":      "300ms",
		"REFUND_POLL_INTERVAL": "300ms",
	}
	for k, v := range both {
		worker[k] = v
	}
	return stack.Start(t, stack.Options{
		BinDir:           binDir,
		Lease:            lease,
		TTL:              ttl,
		StripeTimeout:    time.Second,
		StripeMaxElapsed: 2 * time.Second,
		GatewayTimeout:   5 * time.Second,
		Webhooks:         true,
		Env:              map[string]map[string]string{"api": both, "worker": worker},
	})
}

// histories numbers the histories of this test binary, for their prefix.
var histories atomic.Int64

// TestModel runs generated histories (rapid.Check: -rapid.checks of them,
// about -rapid.steps actions each, from -rapid.seed) against one stack.
// make test-model and make test-model-long set the budget.
func TestModel(t *testing.T) {
	s := startStack(t)
	only := actionFilter(t)
	rapid.Check(t, func(rt *rapid.T) {
		h := newHistory(rt, s)
		rt.Repeat(only(h.actions()))
		h.quiesce()
	})
}

// actionFilter reads MODEL_ACTIONS, a comma-separated list of action names
// (history.actions), and returns a function that keeps only those: a
// search focused on one part of the service (docs/testing.md). Unset or
// empty, it keeps every action.
func actionFilter(t *testing.T) func(map[string]func(*rapid.T)) map[string]func(*rapid.T) {
	names := strings.FieldsFunc(os.Getenv("MODEL_ACTIONS"), func(r rune) bool { return r == ',' || r == ' ' })
	if len(names) == 0 {
		return func(m map[string]func(*rapid.T)) map[string]func(*rapid.T) { return m }
	}
	t.Logf("MODEL_ACTIONS: only %v", names)
	return func(m map[string]func(*rapid.T)) map[string]func(*rapid.T) {
		out := map[string]func(*rapid.T){}
		for _, n := range names {
			f, ok := m[n]
			if !ok {
				t.Fatalf("MODEL_ACTIONS: no action %q", n)
			}
			out[n] = f
		}
		return out
	}
}
