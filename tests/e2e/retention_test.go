package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// Scenario 15 (issue 35, defect 1, as it was reproduced): IDEMPOTENCY_TTL
// is 2s and Stripe answers 401 to our secret key for longer than that
// (3.5s), which the contract keeps resumable: every answer meanwhile is
// 503 payment_provider_unavailable and the key stays unfinished (the
// worker's reaper and completer run all along). The client retries the
// same key until 201, then once more: the replay of the same order, one
// order, one PaymentIntent that moved money, one email. Before, the key's
// retention counted from its claim, so it expired the moment it finished
// and the last retry made a second order and a second charge.
func TestKeyFinishedAfterItsTTLReplays(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	s := setup(t, stack.Options{Lease: 500 * time.Millisecond, TTL: ttl})
	ctx := testCtx(t, 60*time.Second)
	c := s.DirectClient()
	const key = "k-late"
	body := stack.TeeBody("late@example.com", 1)

	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: http.StatusUnauthorized})
	start := time.Now()
	refused := 0
	for time.Since(start) < ttl+1500*time.Millisecond { // the client retrying through the outage
		r := c.Checkout(ctx, key, body)
		require.Equal(t, http.StatusServiceUnavailable, r.Status, "answer: %s %s", r, r.Body)
		require.Equal(t, "payment_provider_unavailable", r.Code)
		refused++
		time.Sleep(200 * time.Millisecond)
	}
	k, ok := s.Key(key)
	require.True(t, ok, "the unfinished key is kept past its TTL")
	require.NotEqual(t, "finished", k.RecoveryPoint)
	s.ClearFaults()

	o := paidOrder(t, last(untilFinal(ctx, t, c, key, body)))
	again := c.Checkout(ctx, key, body)
	require.Equal(t, http.StatusCreated, again.Status, "answer: %s %s", again, again.Body)
	require.True(t, again.Replayed, "the finished key replays for its TTL after its final answer")
	require.Equal(t, o.ID, again.Order.ID)

	requireOnce(t, s, key, o)
	require.Equal(t, 1, s.Orders())
	require.Equal(t, 1, stack.MoneyMoving(s.PaymentIntents()), "one PaymentIntent moved money")
	require.Equal(t, 1, s.Stats().PaymentIntentsCreated)
	t.Logf("%d answers of 503 over %s, then 201 and its replay", refused, time.Since(start).Round(time.Millisecond))
}
