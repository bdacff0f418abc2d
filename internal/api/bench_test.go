package api_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/onceonly/checkout/internal/idempotency"
)

// BenchmarkCheckoutNew measures first executions end to end: gateway, Redis
// lease, transaction 1, the Stripe emulator over HTTP, transaction 2, the
// Redis cache. scripts/bench.sh reports it against pgbench on the same
// server.
func BenchmarkCheckoutNew(b *testing.B) {
	h := setup(b)
	var n atomic.Int64
	b.SetParallelism(8) // 16 clients on 2 cores: enough to keep the database busy
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := h.checkout(fmt.Sprintf("bench-new-%d", n.Add(1)), teeBody)
			if r.status != http.StatusCreated {
				b.Fatalf("status %d: %s", r.status, r.body)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checkouts/s")
}

// BenchmarkCheckoutReplay measures replays answered from the Redis cache.
func BenchmarkCheckoutReplay(b *testing.B) {
	h := setup(b)
	if r := h.checkout("bench-replay", teeBody); r.status != http.StatusCreated {
		b.Fatalf("status %d: %s", r.status, r.body)
	}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := h.checkout("bench-replay", teeBody)
			if r.header.Get(idempotency.ReplayedHeader) != "true" {
				b.Fatalf("status %d: %s", r.status, r.body)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "replays/s")
}
