package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/payments/stripeemu"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// TestCompleterFinishesWithoutClientRetry: the api is SIGKILLed in the
// middle of checkouts and no client ever retries. The worker's completer
// pushes each key forward through the same state machine and Stripe key, so
// every buyer still gets a paid order and one email. With two workers
// running, each key is still completed once: one PaymentIntent per key.
func TestCompleterFinishesWithoutClientRetry(t *testing.T) {
	t.Parallel()
	workerEnv := map[string]string{"IDEMPOTENCY_LEASE": "1s", "COMPLETER_INTERVAL": "200ms"}
	s := setup(t, stack.Options{Lease: time.Second, Env: map[string]map[string]string{"worker": workerEnv}})
	_, secondOps, err := s.AddWorker()
	require.NoError(t, err)
	ctx := testCtx(t, 60*time.Second)

	// Three checkouts reach Stripe, which holds them; then the api dies.
	const n = 3
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: n, Before: 1500 * time.Millisecond})
	waits := make([]func() stack.Result, n)
	for i := range n {
		key := fmt.Sprintf("k-abandoned-%d", i)
		waits[i] = async(func() stack.Result {
			return s.DirectClient().Checkout(ctx, key, stack.TeeBody(fmt.Sprintf("abandoned%d@example.com", i), 1))
		})
	}
	eventually(t, 10*time.Second, func() bool { return s.Stats().InFlight == n }, "Stripe executing %d charges", n)
	s.API.Kill()
	for _, w := range waits {
		require.Equal(t, 0, w().Status, "the killed api answered nothing")
	}

	// No retry: only the completers can finish the keys.
	for i := range n {
		key := fmt.Sprintf("k-abandoned-%d", i)
		eventually(t, 30*time.Second, func() bool {
			k, ok := s.Key(key)
			return ok && k.RecoveryPoint == "finished"
		}, "the completer to finish %s", key)
		k, _ := s.Key(key)
		require.Equal(t, "paid", s.OrderStatus(k.OrderID))
		require.Equal(t, 1, s.Charges(key, k.OrderID), "one PaymentIntent for %s", key)
	}
	require.NoError(t, s.Quiesce(20*time.Second))
	for i := range n {
		k, _ := s.Key(fmt.Sprintf("k-abandoned-%d", i))
		require.Equal(t, 1, s.Emails(k.OrderID), "one email for %s", k.OrderID)
	}
	require.Equal(t, n, s.Orders())
	require.Equal(t, n, s.Stats().PaymentIntentsCreated)

	completed := 0.0
	for _, ops := range []string{s.WorkerOps, secondOps} {
		v, err := stack.Metric(ops+"/metrics", "checkout_completer_keys_total", "result", "completed")
		require.NoError(t, err)
		completed += v
	}
	require.Equal(t, float64(n), completed, "each key completed once across both workers")

	// A client that comes back later gets the completer's answer.
	require.NoError(t, s.API.Start())
	r := s.Client().Checkout(ctx, "k-abandoned-0", stack.TeeBody("abandoned0@example.com", 1))
	require.Equal(t, 201, r.Status)
	require.True(t, r.Replayed)
	require.Equal(t, checkout.StatusPaid, r.Order.Status)
}
