package api_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
)

// BenchmarkCheckout posts fresh-key checkouts (one visa payment each)
// through the API in process, 8 at a time, with the production log level.
// It is the profile behind issue 20's go_cpu_over_pg_cpu (CPU per checkout
// of our Go over PostgreSQL's):
//
//	go test -run '^$' -bench Checkout -benchtime 2000x -cpuprofile cpu.out ./internal/api
//	go tool pprof -top -focus 'onceonly/checkout/internal/(api|checkout|idempotency|outbox|auth|ratelimit|telemetry|problem|httpbody)' cpu.out
//
// The Stripe emulator and the HTTP client run in the same process; their
// frames (internal/stripeemu, net/http client) are not the API's.
func BenchmarkCheckout(b *testing.B) {
	h := setup(b, func(o *options) { o.logLevel = slog.LevelInfo; o.maxConns = 16 })
	var n atomic.Int64
	b.SetParallelism(4) // 4 x GOMAXPROCS (2 here) requests in flight
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := h.checkout(fmt.Sprintf("bench-%d", n.Add(1)), teeBody)
			if r.status != http.StatusCreated {
				b.Errorf("checkout: %d %s", r.status, r.body)
				return
			}
		}
	})
}
