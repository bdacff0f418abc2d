package api_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/payments/stripeemu"
)

// orderOfKey returns the order id the checkout key names.
func (h *harness) orderOfKey(key string) string {
	h.t.Helper()
	var id string
	require.NoError(h.t, h.db.Raw(`SELECT order_id FROM idempotency_keys WHERE key = ?`, key).Scan(&id).Error)
	require.NotEmpty(h.t, id, "order of key %s", key)
	return id
}

// TestDeclineBehindARolledForwardConfirm is issue 20's first defect: the
// first confirm gets a stored 500 that Stripe rolls forward two seconds
// later, the second (sent after the saga read the PaymentIntent still
// unconfirmed) is declined. Stripe leaves a declined PaymentIntent open in
// requires_payment_method, so the late first confirm would charge it. The
// order may fail only once its PaymentIntent is canceled: the client gets
// 402, the order is payment_failed with its stock back, and the
// roll-forward finds the PaymentIntent canceled and moves no money. Before
// the fix: 402, payment_failed, and the PaymentIntent succeeded.
func TestDeclineBehindARolledForwardConfirm(t *testing.T) {
	t.Parallel()
	h := setup(t)
	before := h.stock("sku_tee")
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPIConfirm, Count: 1,
		RollForward: stripeemu.RollForwardAfter(2 * time.Second)}))
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDecline, Op: stripeemu.OpPIConfirm, Count: 1}))

	r := h.checkout("declined-behind-500", teeBody)
	require.Equal(t, http.StatusPaymentRequired, r.status, "%s", r.body)
	require.Equal(t, checkout.CodeCardDeclined, decodeProblem(t, r).Code)
	id := h.orderOfKey("declined-behind-500")

	time.Sleep(2500 * time.Millisecond) // past the roll-forward
	pis := h.requirePaymentInvariants(id, checkout.StatusPaymentFailed)
	require.Len(t, pis, 1)
	require.Equal(t, stripe.PaymentIntentStatusCanceled, pis[0].Status, "closed before the order failed")
	require.Equal(t, before, h.stock("sku_tee"), "stock back")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, id))
	require.Zero(t, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, id))
	replay := h.checkout("declined-behind-500", teeBody)
	require.Equal(t, http.StatusPaymentRequired, replay.status)
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
}

// TestDeclineBehindAConfirmThatSucceededFirst: the same, but the first
// confirm rolls forward while the saga's cancel is on its way (the cancel
// executes a second late): Stripe refuses the cancel of a succeeded
// PaymentIntent, so the order is paid, as at Stripe, and the client's
// answer is 201; one order.paid, no order.payment_failed, stock kept.
func TestDeclineBehindAConfirmThatSucceededFirst(t *testing.T) {
	t.Parallel()
	h := setup(t)
	before := h.stock("sku_tee")
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPIConfirm, Count: 1,
		RollForward: stripeemu.RollForwardAfter(300 * time.Millisecond)}))
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDecline, Op: stripeemu.OpPIConfirm, Count: 1}))
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICancel, Count: 1, Before: time.Second}))

	r := h.checkout("declined-then-paid", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	require.Equal(t, checkout.StatusPaid, o.Status)
	pis := h.requirePaymentInvariants(o.ID, checkout.StatusPaid, stripeemu.OpPICancel)
	require.Len(t, pis, 1)
	require.Equal(t, before-2, h.stock("sku_tee"))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
	require.Zero(t, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, o.ID))
}
