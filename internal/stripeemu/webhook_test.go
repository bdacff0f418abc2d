package stripeemu_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/onceonly/checkout/internal/stripeemu"
)

const whsec = "whsec_test_checkout"

// receiver is a webhook endpoint that records what it gets and answers
// with the status its fail function picks (200 by default).
type receiver struct {
	mu         sync.Mutex
	deliveries []delivery
	fail       func(n int, eventID string) int // n: 1-based count of requests for the event
	url        string
}

type delivery struct {
	body      []byte
	signature string
	eventID   string
	eventType string
}

func newReceiver(t testing.TB, fail func(n int, eventID string) int) *receiver {
	t.Helper()
	rc := &receiver{fail: fail}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		}
		_ = json.Unmarshal(body, &ev)
		rc.mu.Lock()
		rc.deliveries = append(rc.deliveries, delivery{body: body, signature: r.Header.Get("Stripe-Signature"), eventID: ev.ID, eventType: ev.Type})
		n := 0
		for _, d := range rc.deliveries {
			if d.eventID == ev.ID {
				n++
			}
		}
		rc.mu.Unlock()
		status := http.StatusOK
		if rc.fail != nil {
			status = rc.fail(n, ev.ID)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	rc.url = srv.URL
	return rc
}

func (rc *receiver) got() []delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]delivery{}, rc.deliveries...)
}

// byEvent counts the deliveries of each event id.
func (rc *receiver) byEvent() map[string]int {
	out := map[string]int{}
	for _, d := range rc.got() {
		out[d.eventID]++
	}
	return out
}

// hookSetup is an emulator delivering to rc with fast resends.
func hookSetup(t testing.TB, rc *receiver, opts ...stripeemu.Option) bundle {
	t.Helper()
	return setupWith(t, append([]stripeemu.Option{stripeemu.WithWebhookURL(rc.url), stripeemu.WithWebhookSecret(whsec),
		stripeemu.WithWebhookRetry(5*time.Millisecond, 20*time.Millisecond, 5*time.Second)}, opts...)...)
}

// eventTypes lists the emitted event types in order.
func eventTypes(b bundle) []string {
	var out []string
	for _, ev := range b.emu.Webhooks().Events {
		out = append(out, ev.Type)
	}
	return out
}

// allDelivered waits until every emitted event is delivered.
func allDelivered(t testing.TB, b bundle, n int) stripeemu.WebhookLog {
	t.Helper()
	var l stripeemu.WebhookLog
	waitFor(t, "every webhook delivered", func() bool {
		l = b.emu.Webhooks()
		if len(l.Events) != n {
			return false
		}
		for _, ev := range l.Events {
			if ev.Status != "delivered" {
				return false
			}
		}
		return true
	})
	return l
}

func TestWebhooksSignedForStripeGo(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	b := hookSetup(t, rc)
	sc := stripeClient(t, b, apiKey)
	pi := paid(t, sc, 2500)
	require.Equal(t, []string{"payment_intent.created", "payment_intent.succeeded"}, eventTypes(b))
	allDelivered(t, b, 2)

	got := rc.got()
	require.Len(t, got, 2)
	seen := map[string]bool{}
	for _, d := range got {
		ev, err := webhook.ConstructEventWithOptions(d.body, d.signature, whsec, webhook.ConstructEventOptions{})
		require.NoError(t, err, "stripe-go accepts the signature and the API version")
		require.Equal(t, stripe.APIVersion, ev.APIVersion)
		require.Equal(t, d.eventType, string(ev.Type))
		var obj stripe.PaymentIntent
		require.NoError(t, json.Unmarshal(ev.Data.Raw, &obj), "data.object is the full PaymentIntent")
		require.Equal(t, pi.ID, obj.ID)
		require.Equal(t, "ord_r", obj.Metadata["order_id"])
		if ev.Type == "payment_intent.succeeded" {
			require.Equal(t, stripe.PaymentIntentStatusSucceeded, obj.Status)
		} else {
			require.Equal(t, stripe.PaymentIntentStatusRequiresConfirmation, obj.Status)
		}
		require.Equal(t, d.body, b.emu.EventPayload(ev.ID), "the bytes signed are the bytes logged")
		seen[string(ev.Type)] = true

		_, err = webhook.ConstructEventWithOptions(d.body, d.signature, "whsec_other", webhook.ConstructEventOptions{})
		require.Error(t, err, "another secret")
		var generic map[string]any
		require.NoError(t, json.Unmarshal(d.body, &generic))
		reencoded, _ := json.Marshal(generic)
		require.False(t, bytes.Equal(reencoded, d.body))
		_, err = webhook.ConstructEventWithOptions(reencoded, d.signature, whsec, webhook.ConstructEventOptions{})
		require.Error(t, err, "the signature covers the exact bytes")
	}
	require.Len(t, seen, 2)
	require.Equal(t, stripeemu.Sign([]byte("{}"), whsec, time.Unix(1, 0)),
		"t=1,v1="+hex.EncodeToString(webhook.ComputeSignature(time.Unix(1, 0), []byte("{}"), whsec)))
}

func TestWebhookEventPerChange(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, nil)
	b := hookSetup(t, rc)
	sc := stripeClient(t, b, apiKey)

	threeDS, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_authenticationRequired"), Confirm: stripe.Bool(true)})
	require.NoError(t, err)
	_, err = b.emu.Authenticate(threeDS.ID, false)
	require.NoError(t, err)
	_, err = sc.PaymentIntents.Cancel(threeDS.ID, nil)
	require.NoError(t, err)

	pi := paid(t, sc, 2500)
	b.emu.SetRefundsPending(true)
	rf, err := sc.Refunds.New(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(500)})
	require.NoError(t, err)
	_, err = b.emu.FailRefund(rf.ID, "")
	require.NoError(t, err)

	want := []string{"payment_intent.created", "payment_intent.requires_action", "payment_intent.payment_failed",
		"payment_intent.canceled", "payment_intent.created", "payment_intent.succeeded",
		"refund.created", "charge.refunded", "refund.updated", "refund.failed"}
	require.Equal(t, want, eventTypes(b))
	l := allDelivered(t, b, len(want))
	require.Equal(t, rf.ID, l.Events[9].ObjectID)
	require.Equal(t, pi.LatestCharge.ID, l.Events[7].ObjectID)
	for _, d := range rc.got() {
		if d.eventType == "charge.refunded" {
			ev, err := webhook.ConstructEvent(d.body, d.signature, whsec)
			require.NoError(t, err)
			var ch stripe.Charge
			require.NoError(t, json.Unmarshal(ev.Data.Raw, &ch))
			require.Equal(t, int64(500), ch.AmountRefunded)
		}
	}
}

func TestWebhookResentUntil2xx(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(n int, _ string) int {
		if n <= 2 {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	b := hookSetup(t, rc)
	post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
	l := allDelivered(t, b, 1)
	require.Len(t, rc.got(), 3)
	require.Len(t, l.Attempts, 3)
	require.Equal(t, []int{500, 500, 204}, []int{l.Attempts[0].Status, l.Attempts[1].Status, l.Attempts[2].Status})
	require.Equal(t, 3, l.Attempts[2].Attempt)
}

func TestWebhookResendsAreBounded(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(int, string) int { return http.StatusServiceUnavailable })
	b := hookSetup(t, rc, stripeemu.WithWebhookRetry(5*time.Millisecond, 10*time.Millisecond, 100*time.Millisecond))
	post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
	waitFor(t, "the resends to give up", func() bool { return b.emu.Webhooks().Events[0].Status == "failed" })
	n := len(rc.got())
	require.GreaterOrEqual(t, n, 2)
	require.Len(t, b.emu.Webhooks().Attempts, n)
}

func TestCloseStopsResending(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(int, string) int { return http.StatusInternalServerError })
	b := hookSetup(t, rc, stripeemu.WithWebhookRetry(time.Millisecond, 5*time.Millisecond, time.Hour))
	post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
	waitFor(t, "a first attempt", func() bool { return len(rc.got()) > 0 })
	b.emu.Close() // returns although the event would be resent for an hour; goleak checks nothing is left
	// An attempt already on the wire when Close canceled it may still reach
	// the receiver after Close returned (the emulator, canceled, does not
	// log it as ended), so what Close stops is counted on the emulator's
	// side: the attempts it made, none after Close, and at most that one
	// more at the receiver.
	n := len(b.emu.Webhooks().Attempts)
	post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
	require.Equal(t, "unsent", b.emu.Webhooks().Events[1].Status, "nothing is delivered after Close")
	require.Len(t, b.emu.Webhooks().Attempts, n, "no attempt after Close")
	require.LessOrEqual(t, len(rc.got()), n+1)
	for _, d := range rc.got() {
		require.NotEqual(t, b.emu.Webhooks().Events[1].ID, d.eventID, "the event after Close never reaches the receiver")
	}
}

func TestWebhookFaults(t *testing.T) {
	t.Parallel()
	t.Run("duplicate", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, nil)
		b := hookSetup(t, rc)
		// One bad fault in an array refuses the whole array: none is added.
		r := post(t, b, "", "", "/_emulator/webhooks/faults", `[{"kind":"duplicate","count":1},{"kind":"nope"}]`)
		require.Equal(t, http.StatusBadRequest, r.status, string(r.body))
		r = post(t, b, "", "", "/_emulator/webhooks/faults", `{"kind":"duplicate","count":1}`)
		require.Equal(t, http.StatusNoContent, r.status, string(r.body))
		paid(t, stripeClient(t, b, apiKey), 100)
		l := allDelivered(t, b, 2)
		waitFor(t, "both copies", func() bool { return len(rc.got()) == 3 })
		require.Equal(t, map[string]int{l.Events[0].ID: 2, l.Events[1].ID: 1}, rc.byEvent(), "only the first event is duplicated")
		dup := 0
		for _, a := range b.emu.Webhooks().Attempts {
			if a.Duplicate {
				dup++
			}
		}
		require.Equal(t, 1, dup)
	})
	t.Run("drop first", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, nil)
		b := hookSetup(t, rc)
		require.NoError(t, b.emu.InjectWebhookFault(stripeemu.HookFault{Kind: stripeemu.HookDropFirst, Count: 1}))
		post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
		l := allDelivered(t, b, 1)
		require.Len(t, rc.got(), 1, "the dropped attempt never reached the endpoint")
		require.Len(t, l.Attempts, 2)
		require.True(t, l.Attempts[0].Dropped)
		require.Equal(t, 200, l.Attempts[1].Status)
	})
	t.Run("delay", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, nil)
		b := hookSetup(t, rc)
		require.NoError(t, b.emu.InjectWebhookFault(stripeemu.HookFault{Kind: stripeemu.HookDelay, Count: 1, Delay: 30 * time.Millisecond}))
		post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
		allDelivered(t, b, 1)
		require.Len(t, rc.got(), 1)
		require.Empty(t, b.emu.WebhookFaults())
	})
	t.Run("shuffle", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, nil)
		b := hookSetup(t, rc)
		require.NoError(t, b.emu.InjectWebhookFault(stripeemu.HookFault{Kind: stripeemu.HookShuffle, Count: 1, Window: 5}))
		for range 4 {
			post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
		}
		waitFor(t, "four events held", func() bool {
			held := 0
			for _, ev := range b.emu.Webhooks().Events {
				if ev.Status == "held" {
					held++
				}
			}
			return held == 4
		})
		require.Empty(t, rc.got(), "a window is held until it is full")
		post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
		l := allDelivered(t, b, 5)
		got := rc.byEvent()
		require.Len(t, got, 5)
		for _, ev := range l.Events {
			require.Equal(t, 1, got[ev.ID])
		}
		require.Empty(t, b.emu.WebhookFaults(), "the one window was used")
	})
	t.Run("shuffle window released when idle", func(t *testing.T) {
		t.Parallel()
		rc := newReceiver(t, nil)
		b := hookSetup(t, rc)
		require.NoError(t, b.emu.InjectWebhookFault(stripeemu.HookFault{Kind: stripeemu.HookShuffle, Window: 100}))
		post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
		allDelivered(t, b, 1)
	})
	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, f := range []string{`{"kind":"explode"}`, `{"kind":"delay"}`, `{"kind":"shuffle","window":1}`, `{"kind":"delay","delay":"soon"}`} {
			require.Equal(t, http.StatusBadRequest, post(t, b, "", "", "/_emulator/webhooks/faults", f).status, f)
		}
		require.Equal(t, http.StatusNoContent, post(t, b, "", "", "/_emulator/webhooks/faults", `[{"kind":"shuffle"},{"kind":"delay","delay":"1s","count":2}]`).status)
		r := get(t, b, "", "/_emulator/webhooks/faults")
		require.JSONEq(t, `[{"kind":"shuffle","window":10},{"kind":"delay","count":2,"delay":"1s"}]`, string(r.body))
		req, _ := http.NewRequest(http.MethodDelete, b.url+"/_emulator/webhooks/faults", nil)
		require.Equal(t, http.StatusNoContent, do(t, req).status)
		require.Empty(t, b.emu.WebhookFaults())
	})
}

func TestWebhookLogOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t) // no URL: events are logged, not sent
	r := post(t, b, apiKey, "", "/v1/payment_intents", "amount=100&currency=usd")
	id := decode(t, r.body).ID
	r = get(t, b, "", "/_emulator/webhooks")
	require.Equal(t, http.StatusOK, r.status)
	var l stripeemu.WebhookLog
	require.NoError(t, json.Unmarshal(r.body, &l))
	require.Equal(t, "", l.URL)
	require.Len(t, l.Events, 1)
	require.Equal(t, "payment_intent.created", l.Events[0].Type)
	require.Equal(t, id, l.Events[0].ObjectID)
	require.Equal(t, "unsent", l.Events[0].Status)
	require.Empty(t, l.Attempts)
	require.Equal(t, http.StatusNoContent, post(t, b, "", "", "/_emulator/reset", "").status)
	require.Empty(t, b.emu.Webhooks().Events)
}
