package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/stripeemu"
)

// returnURLBody is a 3D Secure checkout with a return_url.
func returnURLBody(returnURL string) string {
	return fmt.Sprintf(`{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":1}],"payment_method":"pm_card_authenticationRequired","return_url":%q}`, returnURL)
}

// redirectOf returns the order's next_action as the redirect flow reads it.
func redirectOf(t testing.TB, o orders.Order) (typ, url, returnURL string) {
	t.Helper()
	var next struct {
		Type          string `json:"type"`
		RedirectToURL struct {
			URL       string `json:"url"`
			ReturnURL string `json:"return_url"`
		} `json:"redirect_to_url"`
	}
	require.NoError(t, json.Unmarshal(o.Payment.NextAction, &next))
	return next.Type, next.RedirectToURL.URL, next.RedirectToURL.ReturnURL
}

// TestReturnURL: a checkout's return_url reaches Stripe's confirm, so a 3D
// Secure card answers 202 with next_action redirect_to_url back to it; it
// is stored with the order and part of the fingerprint (the same key with
// another return_url is 422, one PaymentIntent).
func TestReturnURL(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const back = "https://shop.example/orders/return?cart=7"
	r := h.checkout("ret-1", returnURLBody(back))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	typ, url, ret := redirectOf(t, o)
	require.Equal(t, "redirect_to_url", typ, "the return_url went with the confirm")
	require.Equal(t, back, ret)
	require.Contains(t, url, "payment_intent="+o.Payment.PaymentIntentID)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders WHERE id = ? AND return_url = ?`, o.ID, back))

	again := h.checkout("ret-1", returnURLBody(back))
	require.Equal(t, http.StatusAccepted, again.status)
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, string(r.body), string(again.body))

	other := h.checkout("ret-1", returnURLBody("https://shop.example/elsewhere"))
	require.Equal(t, http.StatusUnprocessableEntity, other.status, "%s", other.body)
	require.Equal(t, "idempotency_key_reused", decodeProblem(t, other).Code)
	require.Len(t, h.intents(o.ID), 1)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))

	// Without a return_url the same card asks for Stripe.js, as before.
	plain := h.checkout("ret-2", threeDSBody)
	require.Equal(t, http.StatusAccepted, plain.status)
	typ, _, _ = redirectOf(t, decodeOrder(t, plain))
	require.Equal(t, "use_stripe_sdk", typ)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders WHERE return_url IS NULL`))
}

// TestReturnURLSurvivesAResume: the first request gives up on an
// unavailable Stripe before confirming (502); its retry resumes the order
// from the database, and its confirm still carries the return_url, which
// therefore has to be stored with the order (a resume has only the order).
func TestReturnURLSurvivesAResume(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.stripe = &payments.Config{Timeout: time.Second, MaxElapsed: 200 * time.Millisecond}
	})
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPIConfirm, Status: 503}))
	const back = "http://127.0.0.1:8081/orders/return"
	first := h.checkout("ret-resume", returnURLBody(back))
	require.Equal(t, http.StatusBadGateway, first.status, "%s", first.body)
	h.emu.ClearFaults()

	var r reply
	eventually(t, "the retry to be served", func() bool {
		r = h.checkout("ret-resume", returnURLBody(back))
		return r.status != http.StatusConflict // the first request's lease
	})
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	typ, _, ret := redirectOf(t, o)
	require.Equal(t, "redirect_to_url", typ)
	require.Equal(t, back, ret)
	require.Len(t, h.intents(o.ID), 1)
}

// TestReturnURLValidation: a return_url that is not an absolute http or
// https URL is a validation_error on return_url, stored nowhere.
func TestReturnURLValidation(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for i, bad := range []string{"/orders/return", "ftp://shop.example/x", "https://", "javascript:alert(1)",
		"https://user:pw@shop.example/", "https://shop.example/a b", "https://shop.example/" + strings.Repeat("a", 5000)} {
		r := h.checkout(fmt.Sprintf("ret-bad-%d", i), returnURLBody(bad))
		require.Equal(t, http.StatusBadRequest, r.status, "%q: %s", bad, r.body)
		p := decodeProblem(t, r)
		require.Equal(t, "validation_error", p.Code)
		require.Len(t, p.Errors, 1)
		require.Equal(t, "return_url", p.Errors[0].Field, bad)
	}
	r := h.checkout("ret-type", `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":1}],"payment_method":"pm_card_visa","return_url":7}`)
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, "return_url", decodeProblem(t, r).Errors[0].Field)
	require.Zero(t, h.count(`SELECT count(*) FROM orders`))
	require.Zero(t, h.count(`SELECT count(*) FROM idempotency_keys`))
}
