package api_test

import (
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
