package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/testenv"
)

// TestACheckoutFinishedAfterItsTTLReplays (issue 35, defect 1): Stripe
// refuses our secret key (401) for longer than IDEMPOTENCY_TTL, which
// keeps the key resumable (503); the client retries with the same key
// until 201, then once more: a replay of the same order, one
// PaymentIntent that moved money. The key's retention counts from its
// final answer. Before, it counted from the claim: the key expired the
// moment it finished, and the last retry made a second order and a second
// charge.
func TestACheckoutFinishedAfterItsTTLReplays(t *testing.T) {
	t.Parallel()
	clk := &testenv.Clock{}
	const ttl = 15 * time.Second
	h := setup(t, func(o *options) { o.ttl = ttl; o.now = clk.Now })

	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: http.StatusUnauthorized}))
	for range 3 { // 25s of 401s, by the service's clock
		r := h.checkout("late", teeBody)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
		require.Equal(t, "payment_provider_unavailable", decodeProblem(t, r).Code)
		clk.Advance(25 * time.Second / 2)
	}
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'late' AND expires_at IS NULL`),
		"past its TTL since the claim, the unfinished key has no end of retention")
	h.emu.ClearFaults()

	first := h.checkout("late", teeBody)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	o := decodeOrder(t, first)

	clk.Advance(ttl - time.Second) // within the TTL after the final answer
	again := h.checkout("late", teeBody)
	requireReplay(t, first, again)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`), "one order for the key")
	pis := h.requirePaymentInvariants(o.ID, string(orders.Paid))
	require.Len(t, pis, 1, "one PaymentIntent, which moved money")
	require.Equal(t, 1, h.emu.TotalCreated())

	// The Postgres layer replays it as well (Redis is an accelerator).
	require.NoError(t, h.rdb.FlushDB(t.Context()).Err())
	requireReplay(t, first, h.checkout("late", teeBody))
}

// TestARefundParkedPastItsTTLReplays (issue 35, defect 2): with the
// defaults REFUND_RETRY_AFTER equals IDEMPOTENCY_TTL (24h; 1h here), so a
// refund whose create got a stored 500 is parked requires_attention only
// when its key is already older than the TTL. The client's retry of the
// same request replays the parked 201; it never runs as a new refund under
// a new Stripe key. When Stripe rolls the first create forward, there is
// one refund of 2000 at Stripe, from one create. Before, the retry made a
// second refund: 4000 refunded for one 2000 request.
func TestARefundParkedPastItsTTLReplays(t *testing.T) {
	t.Parallel()
	clk := &testenv.Clock{}
	const window = time.Hour
	h := setup(t, func(o *options) { o.ttl = window; o.refundRetryAfter = window; o.now = clk.Now })
	orderID, pi := h.paidOrder()
	// Rolled forward well after the refund is parked (the parking runs on
	// the test's clock, the roll-forward on the emulator's).
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpRefundCreate, Count: 1,
		RollForward: stripeemu.RollForwardAfter(5 * time.Second)}))

	first := h.refund(orderID, "parked-past-ttl", `{"amount":2000}`)
	require.Equal(t, http.StatusBadGateway, first.status, "%s", first.body)
	clk.Advance(window + time.Second)
	parked := h.refund(orderID, "parked-past-ttl", `{"amount":2000}`)
	rf := decodeRefund(t, parked)
	require.Equal(t, refunds.StatusRequiresAttention, rf.Status)

	clk.Advance(time.Minute) // past the TTL since the claim, within it since the final answer
	retry := h.refund(orderID, "parked-past-ttl", `{"amount":2000}`)

	eventually(t, "Stripe rolls the stored 500 forward", func() bool {
		for _, r := range h.stripeRefunds(pi) {
			if r.RefundID == rf.ID {
				return true
			}
		}
		return false
	})
	var refunded int64
	for _, r := range h.stripeRefunds(pi) {
		refunded += r.Amount
	}
	require.EqualValues(t, 2000, refunded, "one 2000 refund at Stripe for one 2000 request")
	require.Len(t, h.stripeRefunds(pi), 1)
	require.Equal(t, 1, h.refundCreates(), "never sent again under a new Stripe key")
	requireReplay(t, parked, retry)
	require.Equal(t, "true", retry.header.Get(idempotency.ReplayedHeader))
}
