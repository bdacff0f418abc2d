package stripeemu_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/onceonly/checkout/internal/stripeemu"
)

// eventsAbout returns the types of the events emitted about objectID, in order.
func eventsAbout(b bundle, objectID string) []string {
	var out []string
	for _, ev := range b.emu.Webhooks().Events {
		if ev.ObjectID == objectID {
			out = append(out, ev.Type)
		}
	}
	return out
}

// TestDashboardCancel: the Dashboard cancels a PaymentIntent with any
// cancellation_reason Stripe documents, the automatic ones included, under
// the API cancel's rule on statuses, and Stripe sends
// payment_intent.canceled; a succeeded one cannot be canceled.
func TestDashboardCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	for _, reason := range stripeemu.DashboardCancellationReasons {
		p := &stripe.PaymentIntentParams{Amount: stripe.Int64(1200), Currency: stripe.String("usd"), PaymentMethod: stripe.String("pm_card_visa")}
		pi, err := sc.PaymentIntents.New(p)
		require.NoError(t, err)
		_, err = b.emu.DashboardCancel(pi.ID, reason)
		require.NoError(t, err, reason)
		got, err := sc.PaymentIntents.Get(pi.ID, nil)
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusCanceled, got.Status, reason)
		require.Equal(t, stripe.PaymentIntentCancellationReason(reason), got.CancellationReason, reason)
		require.Equal(t, []string{"payment_intent.created", "payment_intent.canceled"}, eventsAbout(b, pi.ID), reason)
	}
	_, err := b.emu.DashboardCancel("pi_nope", "")
	require.ErrorIs(t, err, stripeemu.ErrNotFound)
	_, err = b.emu.DashboardCancel(paid(t, sc, 500).ID, "requested_by_customer")
	require.ErrorIs(t, err, stripeemu.ErrWrongState)
	_, err = b.emu.DashboardCancel("pi_nope", "bored")
	require.Error(t, err)

	// The control endpoint, as scripts and other processes use it.
	pi, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("usd")})
	require.NoError(t, err)
	resp, err := http.Post(b.url+"/_emulator/payment_intents/"+pi.ID+"/dashboard_cancel", "application/json",
		strings.NewReader(`{"cancellation_reason":"void_invoice"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got, err := sc.PaymentIntents.Get(pi.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentCancellationReasonVoidInvoice, got.CancellationReason)
}

// TestDashboardRefund: the Dashboard refunds part of a payment with no
// idempotency key and no metadata, counted against what the API may still
// refund, and Stripe sends refund.created and charge.refunded; more than
// what is left is refused.
func TestDashboardRefund(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi := paid(t, sc, 5500)
	_, err := b.emu.DashboardRefund(pi.ID, 1000, "requested_by_customer")
	require.NoError(t, err)
	var refunds []*stripe.Refund
	for _, r := range b.emu.Refunds() {
		if r.PaymentIntent.ID == pi.ID {
			refunds = append(refunds, r)
		}
	}
	require.Len(t, refunds, 1)
	require.Equal(t, int64(1000), refunds[0].Amount)
	require.Equal(t, stripe.RefundStatusSucceeded, refunds[0].Status)
	require.Empty(t, refunds[0].Metadata)
	require.Equal(t, []string{"refund.created"}, eventsAbout(b, refunds[0].ID))
	require.Equal(t, []string{"charge.refunded"}, eventsAbout(b, pi.LatestCharge.ID))
	n, _ := amountRefunded(t, sc, pi.ID)
	require.Equal(t, int64(1000), n)

	_, err = sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(5000)})
	require.Error(t, err, "the Dashboard's refund counts against what is left")
	_, err = b.emu.DashboardRefund(pi.ID, 5000, "")
	require.True(t, errors.Is(err, stripeemu.ErrWrongState), "%v", err)
	_, err = b.emu.DashboardRefund(pi.ID, 0, "")
	require.NoError(t, err, "the rest")
	_, err = b.emu.DashboardRefund("pi_nope", 0, "")
	require.ErrorIs(t, err, stripeemu.ErrNotFound)
}
