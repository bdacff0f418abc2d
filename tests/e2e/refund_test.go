package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/tests/e2e/stack"
)

// TestRefundEmailNeverPrecedesPaidEmail: 200 orders paid, then at once
// refunded, with two dispatchers and two workers, and every publish to the
// broker delayed at random (0-300ms), so an order's order.refunded often
// reaches the broker, or a worker, before its order.paid. For every order
// the SMTP sink holds exactly one paid email and one refund email, the
// refund one accepted after the paid one; Stripe holds one refund per
// order; no event is left unpublished.
func TestRefundEmailNeverPrecedesPaidEmail(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{Env: map[string]map[string]string{
		// Only a predecessor can unpark an event during this test.
		"worker": {"NOTIFY_SEQUENCE_WAIT": "10m"},
	}})
	require.NoError(t, s.AMQPDispatcher.Jitter(150, 150))
	_, err := s.AddDispatcher()
	require.NoError(t, err)
	_, workerOps, err := s.AddWorker()
	require.NoError(t, err)

	ctx := testCtx(t, 4*time.Minute)
	c := s.DirectClient()
	const n = 200
	orders := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rs, err := c.CheckoutUntilFinal(ctx, fmt.Sprintf("order-%d", i), stack.TeeBody(fmt.Sprintf("buyer%d@example.com", i), 1), 100*time.Millisecond)
			if err != nil {
				errs <- err
				return
			}
			r := rs[len(rs)-1]
			if r.Status != 201 || r.Order == nil {
				errs <- fmt.Errorf("order %d: %s %s", i, r, r.Body)
				return
			}
			orders[i] = r.Order.ID
			// At once: the paid event is likely still on its way.
			rf, err := c.RefundUntilFinal(ctx, r.Order.ID, fmt.Sprintf("refund-%d", i), `{"amount":1000}`, 100*time.Millisecond)
			if err != nil {
				errs <- err
				return
			}
			if rf.Status != 201 {
				errs <- fmt.Errorf("refund of order %d: %s %s", i, rf, rf.Body)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	eventually(t, 2*time.Minute, func() bool {
		return s.Unpublished() == 0 && len(s.Messages()) >= 2*n
	}, "every event published and %d emails sent (have %d)", 2*n, len(s.Messages()))
	time.Sleep(time.Second) // a duplicate send would land here
	msgs := s.Messages()
	require.Len(t, msgs, 2*n)
	for _, id := range orders {
		paidAt, refundAt := -1, -1
		for i, m := range msgs {
			switch m.Subject {
			case "Your order " + id + " is paid":
				require.Equal(t, -1, paidAt, "one paid email for %s", id)
				paidAt = i
			case "Your refund for order " + id:
				require.Equal(t, -1, refundAt, "one refund email for %s", id)
				refundAt = i
				require.True(t, strings.Contains(m.Body, "10.00 USD"), m.Body)
			}
		}
		require.NotEqual(t, -1, paidAt, "paid email of %s", id)
		require.NotEqual(t, -1, refundAt, "refund email of %s", id)
		require.Less(t, paidAt, refundAt, "order %s: the refund email came before the paid email", id)
		require.Equal(t, "partially_refunded", s.OrderStatus(id))
	}
	require.Equal(t, n, s.Count(`SELECT count(*) FROM refunds WHERE status = 'succeeded'`))
	st := s.RefundsAtStripe()
	require.Len(t, st, n, "one refund per order at Stripe")
	// The delays did reorder: events were parked and unparked, none was
	// released for want of its predecessor.
	metric := func(ops, result string) float64 {
		v, err := stack.Metric(ops+"/metrics", "checkout_notify_sequence_events_total", `result="`+result+`"`)
		require.NoError(t, err)
		return v
	}
	parked := metric(s.WorkerOps, "parked") + metric(workerOps, "parked")
	released := metric(s.WorkerOps, "released_after_wait") + metric(workerOps, "released_after_wait")
	t.Logf("events parked until their predecessor came: %v", parked)
	require.Zero(t, released)
}
