package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/webhooks"
)

// webhookReply is a 200 answer of POST /v1/webhooks/stripe.
type webhookReply struct {
	Received bool   `json:"received"`
	Outcome  string `json:"outcome"`
}

// deliverEvent posts payload to POST /v1/webhooks/stripe with sig as its
// Stripe-Signature (no bearer key, no Idempotency-Key: Stripe sends
// neither).
func (h *harness) deliverEvent(payload []byte, sig string) reply {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+webhooks.Path, bytes.NewReader(payload))
	require.NoError(h.t, err)
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	if sig != "" {
		req.Header.Set("Stripe-Signature", sig)
	}
	return h.send(req)
}

// deliverSigned posts payload signed now with the default secret.
func (h *harness) deliverSigned(payload []byte) reply {
	h.t.Helper()
	return h.deliverEvent(payload, stripeemu.Sign(payload, webhooks.DefaultSecret, time.Now()))
}

// allWebhooksDelivered waits until the emulator has every event it made
// acknowledged by the handler (a 2xx), failing the test otherwise.
func (h *harness) allWebhooksDelivered() {
	h.t.Helper()
	eventually(h.t, "every event delivered", func() bool {
		for _, e := range h.emu.Webhooks().Events {
			if e.Status != "delivered" {
				return false
			}
		}
		return true
	})
}

// webhookOutcome requires a 200 and returns its outcome.
func webhookOutcome(t testing.TB, r reply) string {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var w webhookReply
	require.NoError(t, json.Unmarshal(r.body, &w))
	require.True(t, w.Received)
	return w.Outcome
}

// event returns the exact payload of the emulator's one event of typ about
// object id (the emulator logs events even when it sends none).
func (h *harness) event(typ, objectID string) (id string, payload []byte) {
	h.t.Helper()
	for _, e := range h.emu.Webhooks().Events {
		if e.Type == typ && e.ObjectID == objectID {
			require.Empty(h.t, id, "two %s events for %s", typ, objectID)
			id = e.ID
		}
	}
	require.NotEmpty(h.t, id, "no %s event for %s", typ, objectID)
	return id, h.emu.EventPayload(id)
}

// confirmAsCustomer confirms PaymentIntent id at the emulator with pm, as
// a customer's later attempt through Stripe.js would, and returns Stripe's
// status code and body.
func (h *harness) confirmAsCustomer(id, pm string) (int, string) {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.emuURL+"/v1/payment_intents/"+id+"/confirm",
		strings.NewReader(url.Values{"payment_method": {pm}}.Encode()))
	require.NoError(h.t, err)
	req.Header.Set("Authorization", "Bearer sk_test_123")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	return resp.StatusCode, mustRead(h.t, resp)
}

// confirmAgain is confirmAsCustomer, requiring Stripe to accept it.
func (h *harness) confirmAgain(id, pm string) {
	h.t.Helper()
	status, body := h.confirmAsCustomer(id, pm)
	require.Equal(h.t, http.StatusOK, status, body)
}

// confirmRefused is confirmAsCustomer, requiring Stripe to refuse it: 400
// payment_intent_unexpected_state.
func (h *harness) confirmRefused(id, pm string) {
	h.t.Helper()
	status, body := h.confirmAsCustomer(id, pm)
	require.Equal(h.t, http.StatusBadRequest, status, body)
	require.Contains(h.t, body, "payment_intent_unexpected_state")
}

func (h *harness) webhooks(typ, outcome string) int {
	return int(testutil.ToFloat64(gathered{h.registry.Registry, "checkout_stripe_webhooks_total", map[string]string{"type": typ, "outcome": outcome}}))
}

// TestWebhookSettles3DSecure: with the emulator delivering its webhooks,
// the customer's challenge settles the order with no reconciler running:
// paid with one order.paid, or payment_failed with the stock back.
func TestWebhookSettles3DSecure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		succeed bool
		want    string
		event   string
	}{
		{"authenticated", true, string(orders.Paid), "order.paid"},
		{"authentication failed", false, string(orders.PaymentFailed), "order.payment_failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t, func(o *options) { o.webhooks = true })
			before := h.stock("sku_tee")
			o := threeDS(t, h, "wh-3ds-"+tc.name)
			_, err := h.emu.Authenticate(o.Payment.PaymentIntentID, tc.succeed)
			require.NoError(t, err)
			eventually(t, "the webhook settles the order", func() bool { return h.order(o.ID).Status == tc.want })
			h.requirePaymentInvariants(o.ID, tc.want)
			require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = ?`, o.ID, tc.event))
			if tc.succeed {
				require.Equal(t, before-2, h.stock("sku_tee"))
			} else {
				require.Equal(t, before, h.stock("sku_tee"), "stock given back")
				// Canceled at Stripe first: the customer's client_secret
				// can no longer pay it with another card.
				h.confirmRefused(o.Payment.PaymentIntentID, "pm_card_visa")
				h.requirePaymentInvariants(o.ID, tc.want, stripeemu.OpPIConfirm)
			}
			h.allWebhooksDelivered()
			if tc.succeed {
				require.Equal(t, 1, h.webhooks(webhooks.TypePaymentIntentSucceeded, webhooks.OutcomeApplied))
				return
			}
			// The payment_failed event's handler cancels the PaymentIntent,
			// and the emulator sends payment_intent.canceled at once: the
			// order fails through whichever of the two commits first, once.
			require.Equal(t, 1, h.webhooks(webhooks.TypePaymentIntentPaymentFailed, webhooks.OutcomeApplied)+
				h.webhooks(webhooks.TypePaymentIntentCanceled, webhooks.OutcomeApplied))
		})
	}
}

// TestWebhookSignature: the emulator's exact bytes are applied; the same
// JSON re-encoded, or the exact bytes with a timestamp older than 300s, are
// 400 invalid_signature and change nothing; an event of another API
// version, signed, is applied from the fields used.
func TestWebhookSignature(t *testing.T) {
	t.Parallel()
	h := setup(t)
	o := threeDS(t, h, "wh-sig")
	pi := o.Payment.PaymentIntentID
	_, err := h.emu.Authenticate(pi, true)
	require.NoError(t, err)
	_, payload := h.event(webhooks.TypePaymentIntentSucceeded, pi)

	var generic any
	require.NoError(t, json.Unmarshal(payload, &generic))
	reencoded, err := json.Marshal(generic)
	require.NoError(t, err)
	require.NotEqual(t, string(payload), string(reencoded))
	for name, r := range map[string]reply{
		"re-encoded JSON":       h.deliverEvent(reencoded, stripeemu.Sign(payload, webhooks.DefaultSecret, time.Now())),
		"older than 300s":       h.deliverEvent(payload, stripeemu.Sign(payload, webhooks.DefaultSecret, time.Now().Add(-301*time.Second))),
		"another secret":        h.deliverEvent(payload, stripeemu.Sign(payload, "whsec_someone_else", time.Now())),
		"no Stripe-Signature":   h.deliverEvent(payload, ""),
		"a bearer key is no id": h.deliverEvent(payload, "Bearer sk_test_acme"),
	} {
		require.Equal(t, http.StatusBadRequest, r.status, name)
		require.Contains(t, string(r.body), `"code":"invalid_signature"`, name)
		require.Equal(t, string(orders.RequiresAction), h.order(o.ID).Status, "%s: nothing changes", name)
	}
	require.Zero(t, h.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook'`))
	require.Equal(t, 5, h.webhooks("unverified", webhooks.OutcomeInvalidSignature))

	// The same event as an account on an older API version receives it:
	// stripe-go v76's Event cannot even decode "request" as a string, and
	// its exact version check would refuse it.
	old := bytes.Replace(payload, []byte(`"api_version": "`+apiVersionOf(t, payload)+`"`), []byte(`"api_version": "2019-02-19"`), 1)
	old = bytes.Replace(old, []byte(`"request": {`), []byte(`"request": "req_2019", "request_v2": {`), 1)
	require.NotEqual(t, string(payload), string(old))
	require.Equal(t, webhooks.OutcomeApplied, webhookOutcome(t, h.deliverSigned(old)))
	require.Equal(t, string(orders.Paid), h.order(o.ID).Status)

	// The same event (same id) in its original rendering: recorded already.
	require.Equal(t, webhooks.OutcomeDuplicate, webhookOutcome(t, h.deliverSigned(payload)))
	h.requirePaymentInvariants(o.ID, string(orders.Paid))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
}

func apiVersionOf(t testing.TB, payload []byte) string {
	t.Helper()
	var e struct {
		APIVersion string `json:"api_version"`
	}
	require.NoError(t, json.Unmarshal(payload, &e))
	require.NotEmpty(t, e.APIVersion)
	return e.APIVersion
}

// TestWebhookConcurrentDuplicates: the same event delivered 20 times at
// once: one state change, one outbox event, every answer 200.
func TestWebhookConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	h := setup(t)
	o := threeDS(t, h, "wh-dup")
	_, err := h.emu.Authenticate(o.Payment.PaymentIntentID, true)
	require.NoError(t, err)
	_, payload := h.event(webhooks.TypePaymentIntentSucceeded, o.Payment.PaymentIntentID)

	const n = 20
	outcomes := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := h.deliverSigned(payload)
			if r.status == http.StatusOK {
				var w webhookReply
				_ = json.Unmarshal(r.body, &w)
				outcomes[i] = w.Outcome
			}
		}()
	}
	wg.Wait()
	got := map[string]int{}
	for _, oc := range outcomes {
		got[oc]++
	}
	require.Equal(t, map[string]int{webhooks.OutcomeApplied: 1, webhooks.OutcomeDuplicate: n - 1}, got)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook'`))
	h.requirePaymentInvariants(o.ID, string(orders.Paid))
}

// TestWebhookOrderIndependence: the PaymentIntent first failed its 3D
// Secure challenge (payment_intent.payment_failed), then the customer
// confirmed it again with another card and it succeeded
// (payment_intent.succeeded). Whichever event arrives first, the order ends
// as Stripe says now: paid, one order.paid, no payment_failed ever applied.
func TestWebhookOrderIndependence(t *testing.T) {
	t.Parallel()
	for _, succeededFirst := range []bool{true, false} {
		name := "payment_failed first"
		if succeededFirst {
			name = "succeeded first"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := setup(t)
			o := threeDS(t, h, "wh-order")
			pi := o.Payment.PaymentIntentID
			_, err := h.emu.Authenticate(pi, false)
			require.NoError(t, err)
			h.confirmAgain(pi, "pm_card_visa")
			_, failed := h.event(webhooks.TypePaymentIntentPaymentFailed, pi)
			_, succeeded := h.event(webhooks.TypePaymentIntentSucceeded, pi)

			if succeededFirst {
				require.Equal(t, webhooks.OutcomeApplied, webhookOutcome(t, h.deliverSigned(succeeded)))
				require.Equal(t, webhooks.OutcomeStale, webhookOutcome(t, h.deliverSigned(failed)))
			} else {
				// The older event alone would fail the order; Stripe's current
				// state, retrieved by id, says succeeded.
				require.Equal(t, webhooks.OutcomeApplied, webhookOutcome(t, h.deliverSigned(failed)))
				require.Equal(t, string(orders.Paid), h.order(o.ID).Status)
				require.Equal(t, webhooks.OutcomeStale, webhookOutcome(t, h.deliverSigned(succeeded)))
			}
			h.requirePaymentInvariants(o.ID, string(orders.Paid))
			require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
			require.Zero(t, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, o.ID))
		})
	}
}

// TestWebhookDatabaseCutAfterInboxInsert: the connection dies inside the
// handler's transaction after the inbox insert (the order's update
// terminates its own backend, as a cut link would): 503, nothing recorded;
// Stripe's redelivery applies the event once.
func TestWebhookDatabaseCutAfterInboxInsert(t *testing.T) {
	t.Parallel()
	h := setup(t)
	o := threeDS(t, h, "wh-cut")
	_, err := h.emu.Authenticate(o.Payment.PaymentIntentID, true)
	require.NoError(t, err)
	_, payload := h.event(webhooks.TypePaymentIntentSucceeded, o.Payment.PaymentIntentID)

	require.NoError(t, h.db.Exec(`
		CREATE FUNCTION cut_connection() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT 1 FROM inbox WHERE consumer = 'stripe_webhook') THEN
				PERFORM pg_terminate_backend(pg_backend_pid());
			END IF;
			RETURN NEW;
		END $$`).Error)
	require.NoError(t, h.db.Exec(`CREATE TRIGGER cut_connection BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION cut_connection()`).Error)

	r := h.deliverSigned(payload)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	require.Contains(t, string(r.body), `"code":"unavailable"`)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	require.Zero(t, h.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook'`), "the inbox insert rolled back with the change")
	require.Equal(t, string(orders.RequiresAction), h.order(o.ID).Status)
	require.Zero(t, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
	require.Equal(t, 1, h.webhooks(webhooks.TypePaymentIntentSucceeded, webhooks.OutcomeError))

	require.NoError(t, h.db.Exec(`DROP TRIGGER cut_connection ON orders`).Error)
	require.Equal(t, webhooks.OutcomeApplied, webhookOutcome(t, h.deliverSigned(payload)), "Stripe's redelivery")
	require.Equal(t, webhooks.OutcomeDuplicate, webhookOutcome(t, h.deliverSigned(payload)))
	h.requirePaymentInvariants(o.ID, string(orders.Paid))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
}

// TestWebhookNotOurs: events about objects the service does not know are
// 200 ignored and change nothing.
func TestWebhookNotOurs(t *testing.T) {
	t.Parallel()
	h := setup(t)
	o := threeDS(t, h, "wh-ours")
	_, err := h.emu.Authenticate(o.Payment.PaymentIntentID, true)
	require.NoError(t, err)
	_, payload := h.event(webhooks.TypePaymentIntentSucceeded, o.Payment.PaymentIntentID)

	otherTenant := bytes.Replace(payload, []byte(`"tenant_id": "acme"`), []byte(`"tenant_id": "globex"`), 1)
	require.NotEqual(t, string(payload), string(otherTenant))
	require.Equal(t, webhooks.OutcomeIgnored, webhookOutcome(t, h.deliverSigned(otherTenant)))
	unknown := bytes.Replace(payload, []byte(o.ID), []byte("ord_00000000000000000000000000000000"), -1)
	require.Equal(t, webhooks.OutcomeIgnored, webhookOutcome(t, h.deliverSigned(unknown)))
	require.Equal(t, webhooks.OutcomeIgnored, webhookOutcome(t, h.deliverSigned(
		[]byte(`{"id":"evt_x","object":"event","type":"customer.created","data":{"object":{"id":"cus_1","object":"customer"}}}`))))
	require.Equal(t, string(orders.RequiresAction), h.order(o.ID).Status)
	require.Zero(t, h.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook'`))
}
