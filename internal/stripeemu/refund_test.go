package stripeemu_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/onceonly/checkout/internal/stripeemu"
)

// paid creates a succeeded PaymentIntent of amount USD cents.
func paid(t testing.TB, sc *client.API, amount int64) *stripe.PaymentIntent {
	t.Helper()
	p := &stripe.PaymentIntentParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
	p.AddMetadata("order_id", "ord_r")
	pi, err := sc.PaymentIntents.New(p)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	return pi
}

// amountRefunded reads the PaymentIntent's latest charge's amount_refunded.
func amountRefunded(t testing.TB, sc *client.API, piID string) (int64, bool) {
	t.Helper()
	pi, err := sc.PaymentIntents.Get(piID, &stripe.PaymentIntentParams{Expand: stripe.StringSlice([]string{"latest_charge"})})
	require.NoError(t, err)
	return pi.LatestCharge.AmountRefunded, pi.LatestCharge.Refunded
}

func TestRefundPartialThenRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi := paid(t, sc, 2500)

	p := &stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(1000), Reason: stripe.String("requested_by_customer")}
	p.AddMetadata("refund_id", "rf_1")
	r1, err := sc.Refunds.New(p)
	require.NoError(t, err)
	require.Regexp(t, `^re_`, r1.ID)
	require.Equal(t, stripe.RefundStatusSucceeded, r1.Status)
	require.Equal(t, int64(1000), r1.Amount)
	require.Equal(t, pi.ID, r1.PaymentIntent.ID)
	require.Equal(t, pi.LatestCharge.ID, r1.Charge.ID)
	require.Equal(t, stripe.RefundReasonRequestedByCustomer, r1.Reason)
	require.Equal(t, "rf_1", r1.Metadata["refund_id"])
	n, full := amountRefunded(t, sc, pi.ID)
	require.Equal(t, int64(1000), n)
	require.False(t, full)

	_, err = sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(2000)})
	se := stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeInvalidRequest, se.Type)
	require.Equal(t, "amount", se.Param)
	require.Equal(t, "Refund amount ($20.00) is greater than unrefunded amount on charge ($15.00)", se.Msg)

	r2, err := sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID)})
	require.NoError(t, err, "without amount: the rest")
	require.Equal(t, int64(1500), r2.Amount)
	n, full = amountRefunded(t, sc, pi.ID)
	require.Equal(t, int64(2500), n)
	require.True(t, full)

	_, err = sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(1)})
	se = stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodeChargeAlreadyRefunded, se.Code)

	got, err := sc.Refunds.Get(r1.ID, nil)
	require.NoError(t, err)
	require.Equal(t, r1.ID, got.ID)
	_, err = stripeClient(t, b, "sk_test_other").Refunds.Get(r1.ID, nil)
	require.Equal(t, http.StatusNotFound, stripeErr(t, err).HTTPStatusCode, "another account's refund")

	lp := &stripe.RefundListParams{PaymentIntent: stripe.String(pi.ID)}
	it := sc.Refunds.List(lp)
	var ids []string
	for it.Next() {
		ids = append(ids, it.Refund().ID)
	}
	require.NoError(t, it.Err())
	require.Equal(t, []string{r2.ID, r1.ID}, ids, "newest first")
	require.Len(t, b.emu.Refunds(), 2)
}

func TestRefundRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pending, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_visa")})
	require.NoError(t, err)
	declined := post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd&confirm=true&payment_method=pm_card_chargeDeclined")
	declinedID := decode(t, declined.body).Error.PaymentIntent.ID
	ok := paid(t, sc, 100)

	tests := []struct {
		name, form, code, param string
	}{
		{name: "payment intent not confirmed", form: "payment_intent=" + pending.ID, param: "payment_intent"},
		{name: "payment intent declined", form: "payment_intent=" + declinedID, param: "payment_intent"},
		{name: "unknown payment intent", form: "payment_intent=pi_nope", code: "resource_missing", param: "payment_intent"},
		{name: "neither payment intent nor charge", form: "amount=100", code: "parameter_missing"},
		{name: "reason not one of Stripe's", form: "payment_intent=" + ok.ID + "&reason=changed_mind", code: "parameter_invalid_string", param: "reason"},
		{name: "zero amount", form: "payment_intent=" + ok.ID + "&amount=0", code: "parameter_invalid_integer", param: "amount"},
		{name: "unknown parameter", form: "payment_intent=" + ok.ID + "&colour=red", code: "parameter_unknown", param: "colour"},
	}
	for _, tt := range tests {
		r := post(t, b, apiKey, "", "/v1/refunds", tt.form)
		require.Equal(t, http.StatusBadRequest, r.status, tt.name)
		var body struct {
			Error struct{ Type, Code, Param string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(r.body, &body))
		require.Equal(t, "invalid_request_error", body.Error.Type, tt.name)
		require.Equal(t, tt.code, body.Error.Code, tt.name)
		require.Equal(t, tt.param, body.Error.Param, tt.name)
	}
	_, refunds := state(t, b)
	require.Empty(t, refunds)
	for _, reason := range []string{"duplicate", "fraudulent"} {
		r := post(t, b, apiKey, "", "/v1/refunds", "payment_intent="+paid(t, sc, 100).ID+"&reason="+reason)
		require.Equal(t, http.StatusOK, r.status, string(r.body))
	}
}

func TestRefundPendingThenFailedFreesItsAmount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi := paid(t, sc, 2500)
	require.Equal(t, http.StatusNoContent, post(t, b, "", "", "/_emulator/refunds/pending", `{"on":true}`).status)

	pending, err := sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(2000)})
	require.NoError(t, err)
	require.Equal(t, stripe.RefundStatusPending, pending.Status)
	_, err = sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(1000)})
	require.Equal(t, "Refund amount ($10.00) is greater than unrefunded amount on charge ($5.00)", stripeErr(t, err).Msg,
		"a pending refund counts against what is left")

	r := post(t, b, "", "", "/_emulator/refunds/"+pending.ID+"/fail", `{"failure_reason":"declined"}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	got, err := sc.Refunds.Get(pending.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.RefundStatusFailed, got.Status)
	require.Equal(t, stripe.RefundFailureReason("declined"), got.FailureReason)
	n, _ := amountRefunded(t, sc, pi.ID)
	require.Zero(t, n, "a failed refund gives its amount back")
	require.Equal(t, http.StatusConflict, post(t, b, "", "", "/_emulator/refunds/"+pending.ID+"/fail", "").status)
	require.Equal(t, http.StatusConflict, post(t, b, "", "", "/_emulator/refunds/"+pending.ID+"/succeed", "").status)

	again, err := sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(2500)})
	require.NoError(t, err, "the whole amount is refundable again")
	require.Equal(t, stripe.RefundStatusPending, again.Status)
	r = post(t, b, "", "", "/_emulator/refunds/"+again.ID+"/succeed", "")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	got, err = sc.Refunds.Get(again.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.RefundStatusSucceeded, got.Status)

	// A succeeded refund can still fail later.
	r = post(t, b, "", "", "/_emulator/refunds/"+again.ID+"/fail", "")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	got, err = sc.Refunds.Get(again.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.RefundStatusFailed, got.Status)
	require.Equal(t, stripe.RefundFailureReason("expired_or_canceled_card"), got.FailureReason)
	n, full := amountRefunded(t, sc, pi.ID)
	require.Zero(t, n)
	require.False(t, full)

	require.Equal(t, http.StatusNotFound, post(t, b, "", "", "/_emulator/refunds/re_nope/fail", "").status)
	require.Equal(t, http.StatusBadRequest, post(t, b, "", "", "/_emulator/refunds/"+again.ID+"/fail", `{"failure_reason":"bored"}`).status)
	require.Equal(t, http.StatusBadRequest, post(t, b, "", "", "/_emulator/refunds/pending", `{}`).status)
}

func TestRefundStored500RolledForward(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi := paid(t, sc, 2500)
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Count: 1, Op: stripeemu.OpRefundCreate,
		RollForward: stripeemu.RollForwardAfter(0)}))
	form := "payment_intent=" + pi.ID + "&amount=700"
	first := post(t, b, apiKey, "rk", "/v1/refunds", form)
	require.Equal(t, http.StatusInternalServerError, first.status)
	again := post(t, b, apiKey, "rk", "/v1/refunds", form)
	require.Equal(t, first.body, again.body)
	refunds := b.emu.Refunds()
	require.Len(t, refunds, 1, "the 500 was rolled forward once, the replay refunded nothing")
	require.Equal(t, int64(700), refunds[0].Amount)
	n, _ := amountRefunded(t, sc, pi.ID)
	require.Equal(t, int64(700), n)
}

func TestConcurrentRefundsNeverExceedThePayment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi := paid(t, sc, 2500)

	const n = 20
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			statuses[i] = post(t, b, apiKey, fmt.Sprintf("rf-%d", i), "/v1/refunds", "payment_intent="+pi.ID+"&amount=300").status
		})
	}
	wg.Wait()
	ok := 0
	for _, s := range statuses {
		require.Contains(t, []int{200, 400}, s)
		if s == 200 {
			ok++
		}
	}
	require.Equal(t, 8, ok, "8 x 300 fit in 2500, a 9th does not")
	require.Len(t, b.emu.Refunds(), 8)
	refunded, _ := amountRefunded(t, sc, pi.ID)
	require.Equal(t, int64(2400), refunded)
}

func TestConcurrentSameRefundKeyRefundsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi := paid(t, sc, 2500)
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Op: stripeemu.OpRefundCreate, Before: 200 * time.Millisecond}))
	const n = 50
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = post(t, b, apiKey, "same-refund", "/v1/refunds", "payment_intent="+pi.ID+"&amount=1000")
		})
	}
	wg.Wait()
	ids := map[string]bool{}
	for _, r := range replies {
		require.Contains(t, []int{200, 409}, r.status, string(r.body))
		if r.status == 200 {
			ids[decode(t, r.body).ID] = true
		}
	}
	require.Len(t, ids, 1)
	require.Len(t, b.emu.Refunds(), 1)
}

func TestStateHoldsRefunds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi := paid(t, sc, 2500)
	rf, err := sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(500)})
	require.NoError(t, err)
	pis, refunds := state(t, b)
	require.Len(t, refunds, 1)
	require.Equal(t, rf.ID, refunds[0]["id"])
	require.Equal(t, pi.ID, refunds[0]["payment_intent"])
	require.Equal(t, "succeeded", refunds[0]["status"])
	require.Equal(t, float64(500), pis[0]["latest_charge"].(map[string]any)["amount_refunded"])
}
