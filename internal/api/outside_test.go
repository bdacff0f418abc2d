package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripeemu"
)

// TestDashboardCancelEndsTheOrder (CONTRACT.md v4, issue 35 defect 4):
// support cancels an order's PaymentIntent in Stripe's Dashboard, with
// each cancellation_reason Stripe documents, while the order is on its way
// to paid. Both orders end, their stock comes back and no money moves:
//   - one whose confirm goes unanswered (Stripe answers 503 until the
//     cancel) stays pending_payment until the client's retry of the same
//     key reads the canceled PaymentIntent: payment_failed, and the key's
//     final answer, 402 payment_rejected, replayed since (before the fix,
//     requested_by_customer asked for canceled, which pending_payment may
//     not reach, and the key answered 502 forever);
//   - one waiting for 3D Secure is settled by Stripe's
//     payment_intent.canceled webhook: canceled for requested_by_customer
//     (the lifecycle allows it from requires_action), payment_failed for
//     any other reason.
func TestDashboardCancelEndsTheOrder(t *testing.T) {
	t.Parallel()
	for _, reason := range stripeemu.DashboardCancellationReasons {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			h := setup(t, func(o *options) { o.webhooks = true })
			stock := h.stock("sku_tee")

			// Waiting for the customer's 3D Secure.
			waiting := h.checkout("dash-3ds-"+reason, threeDSBody)
			require.Equal(t, http.StatusAccepted, waiting.status, "%s", waiting.body)
			w := decodeOrder(t, waiting)

			// A confirm that goes unanswered.
			require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPIConfirm, Status: 503}))
			first := h.checkout("dash-pending-"+reason, teeBody)
			require.Equal(t, http.StatusBadGateway, first.status, "%s", first.body)
			var pending string
			require.NoError(t, h.db.Raw(`SELECT id FROM orders WHERE id <> ?`, w.ID).Scan(&pending).Error)
			require.Equal(t, string(orders.PendingPayment), h.order(pending).Status)
			pis := h.intents(pending)
			require.Len(t, pis, 1)

			_, err := h.emu.DashboardCancel(pis[0].ID, reason)
			require.NoError(t, err)
			_, err = h.emu.DashboardCancel(w.Payment.PaymentIntentID, reason)
			require.NoError(t, err)
			h.emu.ClearFaults()

			answers := h.untilFinal("dash-pending-"+reason, teeBody)
			final := answers[len(answers)-1]
			require.Equal(t, http.StatusPaymentRequired, final.status, "%s", final.body)
			var p struct {
				Code    string `json:"code"`
				OrderID string `json:"order_id"`
			}
			require.NoError(t, json.Unmarshal(final.body, &p))
			require.Equal(t, "payment_rejected", p.Code)
			require.Equal(t, pending, p.OrderID)
			// The retry resends the unanswered confirm's key first, which
			// Stripe refuses for a canceled PaymentIntent (400
			// payment_intent_unexpected_state): expected here.
			h.requirePaymentInvariants(pending, string(orders.PaymentFailed), stripeemu.OpPIConfirm)
			again := h.checkout("dash-pending-"+reason, teeBody)
			require.Equal(t, final.status, again.status)
			require.Equal(t, string(final.body), string(again.body), "the final answer replays byte for byte")
			require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))

			want := orders.PaymentFailed
			if reason == "requested_by_customer" {
				want = orders.Canceled
			}
			eventually(t, "the webhook settles the order waiting for 3D Secure", func() bool {
				return h.order(w.ID).Status == string(want)
			})
			h.requirePaymentInvariants(w.ID, string(want), stripeemu.OpPIConfirm)
			require.Equal(t, stock, h.stock("sku_tee"), "both orders gave their stock back")
			require.Zero(t, h.count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'`),
				"no key is left for the completer")
		})
	}
}

// hoodieBody buys one sku_hoodie (5500 cents).
const hoodieBody = `{"email":"buyer@example.com","items":[{"sku":"sku_hoodie","quantity":1}],"payment_method":"pm_card_visa"}`

// TestDashboardRefundReachesTheOrder (CONTRACT.md v4, issue 35 defect 7):
// support refunds 1000 of a paid 5500 order in Stripe's Dashboard (no
// idempotency key, none of our metadata). Stripe's refund.created and
// charge.refunded reach the order through the refunds lifecycle: it is
// partially_refunded with amount_refunded 1000, lists the refund, has one
// order.refunded event (its email), and the API offers only the 4500 left;
// refunding that makes it refunded. Before, the order stayed paid with
// amount_refunded 0 and the API offered the whole 5500.
func TestDashboardRefundReachesTheOrder(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.webhooks = true })
	r := h.checkout("dash-refund", hoodieBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)

	_, err := h.emu.DashboardRefund(o.Payment.PaymentIntentID, 1000, "requested_by_customer")
	require.NoError(t, err)
	eventually(t, "the Dashboard's refund reaches the order", func() bool {
		return h.orderView(o.ID).Status == string(orders.PartiallyRefunded)
	})
	v := h.orderView(o.ID)
	require.EqualValues(t, 1000, v.AmountRefunded)
	require.Len(t, v.Refunds, 1)
	require.EqualValues(t, 1000, v.Refunds[0].Amount)
	require.Equal(t, "succeeded", v.Refunds[0].Status)
	require.NotNil(t, v.Refunds[0].Reason)
	require.Equal(t, "requested_by_customer", *v.Refunds[0].Reason)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.refunded'`, o.ID))

	over := h.refund(o.ID, "after-dash-over", `{"amount":5000}`)
	require.Equal(t, http.StatusConflict, over.status, "%s", over.body)
	require.Contains(t, string(over.body), "refund_exceeds_payment")
	rest := decodeRefund(t, h.refund(o.ID, "after-dash", `{}`))
	require.EqualValues(t, 4500, rest.Amount, "the API refunds only what the Dashboard left")
	v = h.orderView(o.ID)
	require.Equal(t, string(orders.Refunded), v.Status)
	require.EqualValues(t, 5500, v.AmountRefunded)
	require.Len(t, h.stripeRefunds(o.Payment.PaymentIntentID), 2, "two refunds at Stripe, 5500 in all")
	eventually(t, "every event delivered", func() bool {
		for _, e := range h.emu.Webhooks().Events {
			if e.Status != "delivered" {
				return false
			}
		}
		return true
	})
	require.Equal(t, 2, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.refunded'`, o.ID))
	require.Equal(t, 2, h.count(`SELECT count(*) FROM refunds WHERE order_id = ?`, o.ID), "the Dashboard's refund adopted once")
}

// TestDashboardRefundFoundByTheReconciler: with no webhook at all (the
// endpoint down for longer than Stripe resends), the refund reconciler's
// round finds the Dashboard's refund by listing the account's refunds and
// brings it to the order the same way: partially_refunded, 1000 refunded,
// one order.refunded; a second round changes nothing.
func TestDashboardRefundFoundByTheReconciler(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.checkout("dash-refund-poll", hoodieBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	_, err := h.emu.DashboardRefund(o.Payment.PaymentIntentID, 1000, "")
	require.NoError(t, err)
	require.Equal(t, string(orders.Paid), h.orderView(o.ID).Status, "no webhook: nothing knows yet")

	n, err := h.api.Refunds.AdoptOutside(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	v := h.orderView(o.ID)
	require.Equal(t, string(orders.PartiallyRefunded), v.Status)
	require.EqualValues(t, 1000, v.AmountRefunded)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.refunded'`, o.ID))
	n, err = h.api.Refunds.AdoptOutside(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM refunds WHERE order_id = ?`, o.ID))
}
