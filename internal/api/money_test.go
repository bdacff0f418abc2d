package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/sweep"
	"github.com/onceonly/checkout/internal/testenv"
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
	pis := h.requirePaymentInvariants(id, string(orders.PaymentFailed))
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
	require.Equal(t, orders.Paid, o.Status)
	pis := h.requirePaymentInvariants(o.ID, string(orders.Paid), stripeemu.OpPICancel)
	require.Len(t, pis, 1)
	require.Equal(t, before-2, h.stock("sku_tee"))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
	require.Zero(t, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, o.ID))
}

// strayTotal reads checkout_payments_stray_total{result}.
func (h *harness) strayTotal(result string) int {
	return int(testutil.ToFloat64(gathered{h.registry.Registry, "checkout_payments_stray_total", map[string]string{"result": result}}))
}

// TestStrayPaymentRefunded: a PaymentIntent that moves money for an order
// that is not paid (here: one made for a declined order behind the
// service's back, which the lifecycle makes impossible for its own) is
// refunded in full when its payment_intent.succeeded webhook arrives,
// counted once, and the order stays payment_failed. The reconciler's path
// seeing it again refunds nothing more and counts nothing more.
func TestStrayPaymentRefunded(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.webhooks = true })
	answers := h.untilFinal("stray-1", declinedBody) // a 409 while the webhook of the decline holds the order
	r := answers[len(answers)-1]
	require.Equal(t, http.StatusPaymentRequired, r.status, "%s", r.body)
	id := h.orderOfKey("stray-1")

	c := payments.NewClient(payments.Config{APIBase: h.emuURL, SecretKey: "sk_test_123"}, nil, nil)
	pi, err := c.CreatePaymentIntent(t.Context(), checkout.CreateIntentRequest{IdempotencyKey: "behind-our-back",
		Amount: 5000, Currency: "usd", PaymentMethod: "pm_card_visa", OrderID: id, TenantID: "acme"})
	require.NoError(t, err)
	pi, err = c.ConfirmPaymentIntent(t.Context(), checkout.ConfirmIntentRequest{IdempotencyKey: "behind-our-back/confirm", PaymentIntentID: pi.ID})
	require.NoError(t, err)
	require.Equal(t, checkout.PISucceeded, pi.Status)

	refundsOf := func() []*stripe.Refund {
		var out []*stripe.Refund
		for _, rf := range h.emu.Refunds() {
			if rf.PaymentIntent != nil && rf.PaymentIntent.ID == pi.ID {
				out = append(out, rf)
			}
		}
		return out
	}
	eventually(t, "the stray payment refunded", func() bool { return len(refundsOf()) == 1 })
	rf := refundsOf()[0]
	require.EqualValues(t, 5000, rf.Amount, "refunded in full")
	require.Equal(t, stripe.RefundStatusSucceeded, rf.Status)
	// Counted once Stripe's answer is back, just after the refund exists.
	eventually(t, "the stray payment counted", func() bool { return h.strayTotal(checkout.StrayRefunded) == 1 })
	require.Equal(t, string(orders.PaymentFailed), h.order(id).Status, "a stray payment pays no order")

	changed, err := h.api.Service.ApplyPaymentIntent(context.Background(), pi)
	require.NoError(t, err)
	require.False(t, changed)
	require.Len(t, refundsOf(), 1, "refunded once")
	require.Equal(t, 1, h.strayTotal(checkout.StrayRefunded), "counted once")
	for _, rq := range h.emu.Requests() {
		if rq.Op == stripeemu.OpRefundCreate {
			require.Equal(t, checkout.StrayRefundKey(id, pi.ID, 1), rq.IdempotencyKey)
		}
	}
}

// TestStripeCredentialsRefused: Stripe refuses our own secret key (401, as
// after a rotation, then 403, a restricted key): that is not the
// customer's payment being rejected. The checkout answers 503
// payment_provider_unavailable with Retry-After, stores nothing, keeps the
// order pending with its stock, (internal/payments counts the call as
// credentials_refused); once the key works, the same Idempotency-Key resumes and pays, with one
// PaymentIntent. Before the fix: 402 payment_rejected, stored for good.
func TestStripeCredentialsRefused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	before := h.stock("sku_tee")
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: status}))
		r := h.checkout("rotated-key", teeBody)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%d: %s", status, r.body)
		require.Equal(t, "payment_provider_unavailable", decodeProblem(t, r).Code)
		require.Equal(t, "30", r.header.Get("Retry-After"))
		h.emu.ClearFaults()
	}
	id := h.orderOfKey("rotated-key")
	require.Equal(t, string(orders.PendingPayment), h.order(id).Status)
	require.Equal(t, before-2, h.stock("sku_tee"), "the stock stays reserved")
	require.Zero(t, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'rotated-key' AND recovery_point = 'finished'`), "nothing stored")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE order_id = ? AND outcome IS NULL`, id), "the attempt stays open")

	r := h.checkout("rotated-key", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	require.Equal(t, id, o.ID, "the same order, resumed")
	pis := h.requirePaymentInvariants(id, string(orders.Paid))
	require.Len(t, pis, 1)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE order_id = ? AND step = 'create'`, id), "the same create key, sent again")
}

// TestActionTimeoutWhateverThePaymentIntentStatus: PAYMENT_ACTION_TIMEOUT
// applies to an order waiting in requires_action whatever its
// PaymentIntent's status. Here Stripe says requires_confirmation (the
// customer's browser attached another payment method and stopped), which
// settles nothing: before the timeout the order waits; after it the
// PaymentIntent is canceled (abandoned), the order is payment_failed with
// code payment_action_timeout and its stock back. Before the fix the
// timeout applied to requires_action only, and such an order held its
// stock forever.
func TestActionTimeoutWhateverThePaymentIntentStatus(t *testing.T) {
	t.Parallel()
	for _, status := range []string{checkout.PIRequiresConfirmation, checkout.PIRequiresPaymentMethod} {
		t.Run(status, func(t *testing.T) {
			t.Parallel()
			clk := &testenv.Clock{}
			h := setup(t, func(o *options) {
				o.now = clk.Now
				o.saga = checkout.SagaConfig{ActionTimeout: 30 * time.Minute}
				o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider {
					return &scripted{PaymentProvider: p, retrieve: func(pi checkout.PaymentIntentState) checkout.PaymentIntentState {
						if pi.Status == checkout.PIRequiresAction {
							pi.Status, pi.NextAction = status, nil // what the customer's browser left
						}
						return pi
					}}
				}
			})
			before := h.stock("sku_tee")
			o := threeDS(t, h, "3ds-timeout")
			rec := h.reconciler(clk.Now)
			round, err := rec.RunOnce(context.Background())
			require.NoError(t, err)
			require.Equal(t, sweep.ReconcileRound{Unchanged: 1}, round, "within the timeout: it waits")

			clk.Advance(31 * time.Minute)
			round, err = rec.RunOnce(context.Background())
			require.NoError(t, err)
			require.Equal(t, sweep.ReconcileRound{Changed: 1}, round)
			pis := h.requirePaymentInvariants(o.ID, string(orders.PaymentFailed))
			require.Equal(t, stripe.PaymentIntentStatusCanceled, pis[0].Status)
			require.Equal(t, stripe.PaymentIntentCancellationReasonAbandoned, pis[0].CancellationReason)
			require.Equal(t, before, h.stock("sku_tee"), "stock back")
			var code string
			require.NoError(t, h.db.Raw(`SELECT payment_failure_code FROM orders WHERE id = ?`, o.ID).Scan(&code).Error)
			require.Equal(t, "payment_action_timeout", code)
		})
	}
}

// TestOrphanOfAnOrderWithoutPaymentIntent: the first create is answered
// with a stored 500 that Stripe rolls forward after the saga's search
// looked; the second create is refused, so the order fails with no
// PaymentIntent recorded. The PaymentIntent that appears afterwards is the
// order's orphan all the same: the reconciler's sweep finds it (search by
// metadata['order_id']) and cancels it. Before the fix the sweep looked
// only at orders with a PaymentIntent of their own, and it stayed open.
func TestOrphanOfAnOrderWithoutPaymentIntent(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider {
			return &scripted{PaymentProvider: p, create: func(n int, req checkout.CreateIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error) {
				if n == 2 {
					return checkout.PaymentIntentState{}, &checkout.PaymentRefusal{HTTPStatus: http.StatusBadRequest,
						Type: "invalid_request_error", Code: "parameter_invalid_empty", Message: "refused (test)"}
				}
				return real.CreatePaymentIntent(context.Background(), req)
			}}
		}
	})
	before := h.stock("sku_tee")
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate, Count: 1,
		RollForward: stripeemu.RollForwardAfter(500 * time.Millisecond)}))
	r := h.checkout("orphan-no-pi", teeBody)
	require.Equal(t, http.StatusPaymentRequired, r.status, "%s", r.body)
	require.Equal(t, checkout.CodePaymentRejected, decodeProblem(t, r).Code)
	id := h.orderOfKey("orphan-no-pi")
	require.Nil(t, h.order(id).PaymentIntentID, "no PaymentIntent recorded")
	require.Equal(t, before, h.stock("sku_tee"))
	eventually(t, "Stripe to roll the first create forward", func() bool { return len(h.intents(id)) == 1 })

	rec := h.reconciler(time.Now)
	round, err := rec.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.ReconcileRound{Orphans: 1}, round)
	pis := h.requirePaymentInvariants(id, string(orders.PaymentFailed))
	require.Len(t, pis, 1)
	require.Equal(t, stripe.PaymentIntentStatusCanceled, pis[0].Status)
	require.Equal(t, stripe.PaymentIntentCancellationReasonDuplicate, pis[0].CancellationReason)

	round, err = rec.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.ReconcileRound{}, round, "swept again only after ORPHAN_SWEEP_INTERVAL")
}

// failureCode returns why order id left the way to paid
// (orders.payment_failure_code), "" while it has not.
func (h *harness) failureCode(id string) string {
	h.t.Helper()
	var code *string
	require.NoError(h.t, h.db.Raw(`SELECT payment_failure_code FROM orders WHERE id = ?`, id).Scan(&code).Error)
	if code == nil {
		return ""
	}
	return *code
}

// TestARejectionKeepsItsReasonWhenItsCancelWebhookComesFirst: a confirm
// that Stripe refuses (a 400 that is not a card error) fails the order only
// after the service cancels its PaymentIntent, with cancellation_reason
// abandoned, the only one of Stripe's that fits. The cancel's
// payment_intent.canceled webhook may reach the API before the request's
// own settling transaction (here the cancel's answer comes a second after
// the cancel and its webhook). The webhook handler must then fail the order
// for the reason the service recorded with its cancel, payment_rejected,
// not guess one from Stripe's state (abandoned, no payment error: an
// abandoned 3D Secure). Before the fix the order's failure code was
// payment_action_timeout and the stored 402 said the customer had not
// authenticated in time (a newcomer saw it in 18 checkouts of 25).
func TestARejectionKeepsItsReasonWhenItsCancelWebhookComesFirst(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.webhooks = true })
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPIConfirm, Count: 1, Status: http.StatusBadRequest}))
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICancel, Count: 1, After: time.Second}))

	r := h.checkout("rejected-webhook-first", teeBody)
	require.Equal(t, http.StatusPaymentRequired, r.status, "%s", r.body)
	p := decodeProblem(t, r)
	require.Equal(t, checkout.CodePaymentRejected, p.Code)
	require.NotContains(t, p.Detail, "authentication", "a rejection is not an abandoned 3D Secure")
	id := h.orderOfKey("rejected-webhook-first")
	require.Equal(t, checkout.CodePaymentRejected, h.failureCode(id))
	pis := h.requirePaymentInvariants(id, string(orders.PaymentFailed), stripeemu.OpPIConfirm)
	require.Len(t, pis, 1)
	require.Equal(t, stripe.PaymentIntentStatusCanceled, pis[0].Status)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, id))
	replay := h.checkout("rejected-webhook-first", teeBody)
	require.Equal(t, r.body, replay.body, "stored as answered")
}

// TestCredentialsRefusedAfterAConfirmThatWentThrough: a confirm answered
// with a stored 500 that Stripe rolls forward at once, then Stripe refusing
// this service's credentials when the saga reads the PaymentIntent back.
// The money has moved, though the service cannot know it yet: the 503 must
// not tell the client that nothing was charged (a client believing it
// could pay again under a new key), and the same key, once the key works,
// answers 201 with the one PaymentIntent that moved money. Before the fix
// the 503 said "nothing was charged".
func TestCredentialsRefusedAfterAConfirmThatWentThrough(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPIConfirm, Count: 1,
		RollForward: stripeemu.RollForwardAfter(0)}))
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPIRetrieve, Status: http.StatusUnauthorized}))

	r := h.checkout("charged-then-refused", teeBody)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	p := decodeProblem(t, r)
	require.Equal(t, "payment_provider_unavailable", p.Code)
	require.NotContains(t, p.Detail, "nothing was charged")
	require.Contains(t, p.Detail, "same Idempotency-Key")
	id := h.orderOfKey("charged-then-refused")
	pis := h.intents(id)
	require.Len(t, pis, 1)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, pis[0].Status, "the money moved meanwhile")

	h.emu.ClearFaults()
	again := h.checkout("charged-then-refused", teeBody)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	require.Len(t, h.requirePaymentInvariants(id, string(orders.Paid)), 1)
}
