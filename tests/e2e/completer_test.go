package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripeemu"
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
	require.Equal(t, string(orders.Paid), r.Order.Status)
}

// TestKillAtEachSagaStep: the api is SIGKILLed at each boundary of the
// payment saga, and nobody retries: while the create or the confirm is in
// flight at Stripe (executed after the kill), and after Stripe answered it
// (the answer lost with the process). The worker's completer resumes from
// the persisted steps (payment_attempts), resending only the key of the
// step in doubt, and finishes each checkout once: the order paid, one
// PaymentIntent moving money and no other, one email, the key completed
// once.
func TestKillAtEachSagaStep(t *testing.T) {
	t.Parallel()
	workerEnv := map[string]string{"IDEMPOTENCY_LEASE": "1s", "COMPLETER_INTERVAL": "200ms"}
	s := setup(t, stack.Options{Lease: time.Second, Env: map[string]map[string]string{"worker": workerEnv}})
	ctx := testCtx(t, 120*time.Second)

	steps := []struct {
		name  string
		fault stripeemu.Fault
		// executing says when to kill: the step has reached Stripe.
		executing func() bool
	}{
		{name: "create in flight", fault: stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, Before: 1500 * time.Millisecond},
			executing: func() bool { return s.Stats().InFlight == 1 }},
		{name: "create answered", fault: stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, After: 1500 * time.Millisecond}},
		{name: "confirm in flight", fault: stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPIConfirm, Count: 1, Before: 1500 * time.Millisecond},
			executing: func() bool { return s.Stats().InFlight == 1 }},
		{name: "confirm answered", fault: stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPIConfirm, Count: 1, After: 1500 * time.Millisecond}},
	}
	for i, st := range steps {
		key := fmt.Sprintf("k-kill-%d", i)
		s.Fault(st.fault)
		before := len(s.Stats().Requests)
		wait := async(func() stack.Result {
			return s.DirectClient().Checkout(ctx, key, stack.TeeBody(fmt.Sprintf("kill%d@example.com", i), 1))
		})
		if st.executing != nil {
			eventually(t, 10*time.Second, st.executing, "%s: Stripe executing", st.name)
		} else {
			// An answered step is logged before its delayed answer is sent.
			op := st.fault.Op
			eventually(t, 10*time.Second, func() bool {
				for _, r := range s.Stats().Requests[before:] {
					if r.Op == op && r.Status == 200 {
						return true
					}
				}
				return false
			}, "%s: Stripe answered", st.name)
		}
		s.API.Kill()
		require.Equal(t, 0, wait().Status, "%s: the killed api answered nothing", st.name)

		eventually(t, 30*time.Second, func() bool {
			k, ok := s.Key(key)
			return ok && k.RecoveryPoint == "finished"
		}, "%s: the completer to finish %s", st.name, key)
		k, _ := s.Key(key)
		require.Equal(t, "paid", s.OrderStatus(k.OrderID), st.name)
		pis := stack.IntentsByOrder(s.PaymentIntents())[k.OrderID]
		require.Len(t, pis, 1, "%s: one PaymentIntent for the order", st.name)
		require.Equal(t, "succeeded", pis[0].Status, st.name)
		require.NoError(t, s.API.Start())
	}
	require.NoError(t, s.Quiesce(20*time.Second))
	for i := range steps {
		k, _ := s.Key(fmt.Sprintf("k-kill-%d", i))
		require.Equal(t, 1, s.Emails(k.OrderID), "one email for %s", k.OrderID)
	}
	v, err := stack.Metric(s.WorkerOps+"/metrics", "checkout_completer_keys_total", "result", "completed")
	require.NoError(t, err)
	require.Equal(t, float64(len(steps)), v, "each key completed once")
	for _, r := range s.Stats().Requests {
		require.NotEqual(t, 400, r.Status, "no idempotency_error: %s %s", r.Method, r.Path)
	}
}

// TestThreeDSecureThroughTheWorker: three checkouts need 3D Secure (202,
// replayed as stored). The customer of the first authenticates, the second
// fails the challenge, the third cancels through the API. The worker's
// reconciler, polling Stripe, settles the first two without any client
// call: paid with one email, payment_failed with the stock back; the
// cancellation is canceled at Stripe with its stock back.
func TestThreeDSecureThroughTheWorker(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{})
	ctx := testCtx(t, 60*time.Second)
	c := s.DirectClient()
	stock := func() int {
		return s.Count(`SELECT stock FROM products WHERE sku = 'sku_tee'`)
	}
	before := stock()

	orders := make([]*stack.Order, 3)
	for i := range orders {
		body := stack.TeeBody(fmt.Sprintf("threeds%d@example.com", i), 1)
		body.PaymentMethod = "pm_card_authenticationRequired"
		key := fmt.Sprintf("k-3ds-%d", i)
		r := c.Checkout(ctx, key, body)
		require.Equal(t, 202, r.Status, "%s %s", r, r.Body)
		require.Equal(t, "requires_action", r.Order.Status)
		again := c.Checkout(ctx, key, body)
		require.Equal(t, 202, again.Status)
		require.True(t, again.Replayed)
		require.Equal(t, string(r.Body), string(again.Body))
		orders[i] = r.Order
	}
	require.Equal(t, before-3, stock(), "reserved while the customers authenticate")

	s.Authenticate(orders[0].Payment.PaymentIntentID, true)
	s.Authenticate(orders[1].Payment.PaymentIntentID, false)
	canceled := c.CancelOrder(ctx, orders[2].ID, "k-3ds-cancel")
	require.Equal(t, 200, canceled.Status, "%s %s", canceled, canceled.Body)
	require.Equal(t, "canceled", canceled.Order.Status)

	eventually(t, 20*time.Second, func() bool {
		return s.OrderStatus(orders[0].ID) == "paid" && s.OrderStatus(orders[1].ID) == "payment_failed"
	}, "the reconciler to settle both orders")
	require.NoError(t, s.Quiesce(20*time.Second))
	require.Equal(t, 1, s.Emails(orders[0].ID))
	require.Zero(t, s.Emails(orders[1].ID))
	require.Zero(t, s.Emails(orders[2].ID))
	require.Equal(t, before-1, stock(), "the failed and the canceled order gave their stock back")
	byOrder := stack.IntentsByOrder(s.PaymentIntents())
	// The failed challenge's PaymentIntent is canceled too: its customer
	// holds the client_secret and could otherwise pay it with another card.
	for i, want := range []string{"succeeded", "canceled", "canceled"} {
		require.Len(t, byOrder[orders[i].ID], 1)
		require.Equal(t, want, byOrder[orders[i].ID][0].Status)
	}
	require.Equal(t, 1, s.Count(`SELECT count(*) FROM outbox WHERE type = 'order.canceled'`))
}
