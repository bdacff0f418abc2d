package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/stripestep"
	"github.com/onceonly/checkout/internal/sweep"
	"github.com/onceonly/checkout/internal/testenv"
	"github.com/onceonly/checkout/internal/webhooks"
)

const threeDSBody = `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_authenticationRequired"}`

// TestStripeFaultsBySagaStep is CONTRACT.md's "Payments against Stripe's
// real semantics" as a table: each of Stripe's failure modes, at the create
// and at the confirm step. For each: the client's retries end in a final
// answer (201), the order is paid exactly when its one PaymentIntent
// succeeded at Stripe, no other PaymentIntent of the order moves money
// (every other one is canceled), and Stripe never answered
// idempotency_error (no key was ever sent again with other parameters).
func TestStripeFaultsBySagaStep(t *testing.T) {
	t.Parallel()
	type fault struct {
		name string
		// stripe sets the client's timeouts; nil: the harness's.
		stripe *payments.Config
		faults func(op string) []stripeemu.Fault
		// pruned: the first request gives up (502), Stripe forgets its
		// keys, a day passes, and the retry comes.
		pruned bool
		// wantPIs is how many PaymentIntents the order has at the end.
		wantPIs func(op string) int
	}
	one := func(string) int { return 1 }
	faults := []fault{
		{name: "stored 500", faults: func(op string) []stripeemu.Fault {
			return []stripeemu.Fault{{Kind: stripeemu.FaultStored500, Op: op, Count: 1}}
		}, wantPIs: one},
		{name: "stored 500 rolled forward", faults: func(op string) []stripeemu.Fault {
			return []stripeemu.Fault{{Kind: stripeemu.FaultStored500, Op: op, Count: 1, RollForward: stripeemu.RollForwardAfter(0)}}
		}, wantPIs: one},
		{name: "dropped answer", faults: func(op string) []stripeemu.Fault {
			return []stripeemu.Fault{{Kind: stripeemu.FaultDrop, Op: op, Count: 1}}
		}, wantPIs: one},
		{name: "timeout", stripe: &payments.Config{Timeout: 200 * time.Millisecond, MaxElapsed: 3 * time.Second},
			faults: func(op string) []stripeemu.Fault {
				return []stripeemu.Fault{{Kind: stripeemu.FaultDelay, Op: op, Count: 1, After: 600 * time.Millisecond}}
			}, wantPIs: one},
		{name: "409 in flight", stripe: &payments.Config{Timeout: 200 * time.Millisecond, MaxElapsed: 3 * time.Second},
			faults: func(op string) []stripeemu.Fault {
				return []stripeemu.Fault{{Kind: stripeemu.FaultDelay, Op: op, Count: 1, Before: 600 * time.Millisecond}}
			}, wantPIs: one},
		{name: "429", faults: func(op string) []stripeemu.Fault {
			return []stripeemu.Fault{{Kind: stripeemu.FaultFail, Op: op, Count: 2, Status: 429, Code: "lock_timeout"}}
		}, wantPIs: one},
		{name: "503", faults: func(op string) []stripeemu.Fault {
			return []stripeemu.Fault{{Kind: stripeemu.FaultFail, Op: op, Count: 2, Status: 503}}
		}, wantPIs: one},
		{name: "key pruned between attempts", pruned: true,
			// One try, which times out: the step ran, its answer is lost.
			stripe: &payments.Config{Timeout: 200 * time.Millisecond, MaxElapsed: time.Millisecond},
			faults: func(op string) []stripeemu.Fault {
				return []stripeemu.Fault{{Kind: stripeemu.FaultDelay, Op: op, Count: 1, After: 600 * time.Millisecond}}
			}, wantPIs: one},
	}
	for _, f := range faults {
		for _, op := range []string{stripeemu.OpPICreate, stripeemu.OpPIConfirm} {
			t.Run(f.name+" at "+op, func(t *testing.T) {
				t.Parallel()
				clk := &testenv.Clock{}
				h := setup(t, func(o *options) {
					o.stripe, o.now, o.ttl = f.stripe, clk.Now, 72*time.Hour
				})
				for _, x := range f.faults(op) {
					require.NoError(t, h.emu.Inject(x))
				}
				key := "fault-" + strings.ReplaceAll(f.name, " ", "-")
				var answers []reply
				if f.pruned {
					first := h.checkout(key, teeBody)
					require.Equal(t, http.StatusBadGateway, first.status, "%s", first.body)
					require.Equal(t, "payment_provider_unavailable", decodeProblem(t, first).Code)
					h.emu.PruneKeys()
					clk.Advance(25 * time.Hour)
					answers = append(answers, first)
				}
				answers = append(answers, h.untilFinal(key, teeBody)...)

				final := answers[len(answers)-1]
				require.Equal(t, http.StatusCreated, final.status, "%s", final.body)
				o := decodeOrder(t, final)
				require.Equal(t, orders.Paid, o.Status)
				pis := h.requirePaymentInvariants(o.ID, string(orders.Paid))
				require.Len(t, pis, f.wantPIs(op), "PaymentIntents of the order")
				require.Equal(t, o.Payment.PaymentIntentID, pis[0].ID)
				require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`), "one order for the key")
				require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE type = 'order.paid'`))
				require.Equal(t, 0, h.count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'`))

				// Every Stripe write carried a key derived from the order.
				for _, r := range h.emu.Requests() {
					if r.Method == http.MethodPost {
						require.True(t, strings.HasPrefix(r.IdempotencyKey, o.ID+"/"), "key %q", r.IdempotencyKey)
					}
				}
			})
		}
	}
}

// TestIndeterminateCreateWaitsForSearch: after a stored 500 at create, the
// saga searches Stripe only once STRIPE_SEARCH_SETTLE has passed (the index
// lags behind writes); until then it answers 502, with a Retry-After of the
// time left before the search settles, and creates nothing new.
// The PaymentIntent the 500 rolled forward (created, unconfirmed) is then
// found and adopted, not duplicated.
func TestIndeterminateCreateWaitsForSearch(t *testing.T) {
	t.Parallel()
	clk := &testenv.Clock{}
	h := setup(t, func(o *options) {
		o.now = clk.Now
		o.saga = checkout.SagaConfig{SearchSettle: time.Minute}
	})
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate, Count: 1,
		RollForward: stripeemu.RollForwardAfter(0)}))

	r := h.checkout("settle-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	require.Equal(t, "60", r.header.Get("Retry-After"), "nothing can get further before the search settles")
	clk.Advance(45 * time.Second)
	r = h.checkout("settle-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "still within the settle delay: %s", r.body)
	require.Equal(t, "15", r.header.Get("Retry-After"), "the rest of the settle delay")
	require.Equal(t, 1, h.emu.TotalCreated(), "no new attempt before the search")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE step = 'create'`))
	for _, rq := range h.emu.Requests() {
		require.NotEqual(t, stripeemu.OpPISearch, rq.Op, "no search before it settles")
	}

	clk.Advance(15 * time.Second)
	r = h.checkout("settle-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	pis := h.requirePaymentInvariants(o.ID, string(orders.Paid))
	require.Len(t, pis, 1, "the rolled-forward PaymentIntent was adopted")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE step = 'create'`), "no second create")
}

// TestOrphansCanceled: an indeterminate create is reconciled by a search
// that finds two PaymentIntents for the order (as two creates rolled
// forward by Stripe would leave): the saga adopts one, confirms only that
// one, and cancels the other (cancellation_reason duplicate).
func TestOrphansCanceled(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.stripe = &payments.Config{Timeout: time.Second, MaxElapsed: 100 * time.Millisecond}
	})
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate, Count: 1}))
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPISearch, Status: 503}))
	r := h.checkout("orphan-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	var orderID string
	require.NoError(t, h.db.Raw(`SELECT order_id FROM idempotency_keys WHERE key = 'orphan-1'`).Scan(&orderID).Error)
	require.Empty(t, h.intents(orderID))

	// Two unconfirmed PaymentIntents of the order appear, as Stripe's
	// remediation rolling requests forward would make them.
	c := payments.NewClient(payments.Config{APIBase: h.emuURL, SecretKey: "sk_test_123"}, nil, nil)
	for i := range 2 {
		_, err := c.CreatePaymentIntent(t.Context(), checkout.CreateIntentRequest{
			IdempotencyKey: fmt.Sprintf("rolled-forward-%d", i), Amount: 5000, Currency: "usd",
			PaymentMethod: "pm_card_visa", OrderID: orderID, TenantID: "acme"})
		require.NoError(t, err)
	}
	h.emu.ClearFaults()

	final := h.untilFinal("orphan-1", teeBody)
	last := final[len(final)-1]
	require.Equal(t, http.StatusCreated, last.status, "%s", last.body)
	pis := h.requirePaymentInvariants(orderID, string(orders.Paid))
	require.Len(t, pis, 2, "adopted, not created again")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE order_id = ? AND step = 'create'`, orderID))
	canceled := 0
	for _, pi := range pis {
		if pi.Status == stripe.PaymentIntentStatusCanceled {
			canceled++
			require.Equal(t, stripe.PaymentIntentCancellationReasonDuplicate, pi.CancellationReason)
		}
	}
	require.Equal(t, 1, canceled, "the other PaymentIntent of the order is canceled")
}

// TestUnknownPaymentMethod: Stripe refuses an unknown payment method (400
// resource_missing): 402 payment_rejected, stored and replayed; the order
// payment_failed with its stock back; the key finished; and no further
// Stripe call for the order in a round of the completer and the reconciler.
func TestUnknownPaymentMethod(t *testing.T) {
	t.Parallel()
	h := setup(t)
	before := h.stock("sku_tee")
	body := strings.Replace(teeBody, "pm_card_visa", "pm_card_doesNotExist", 1)
	r := h.checkout("unknown-pm-1", body)
	require.Equal(t, http.StatusPaymentRequired, r.status, "%s", r.body)
	p := decodeProblem(t, r)
	require.Equal(t, "payment_rejected", p.Code)
	require.NotEmpty(t, p.OrderID)
	require.Equal(t, before, h.stock("sku_tee"), "stock released")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders WHERE id = ? AND status = 'payment_failed'`, p.OrderID))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, p.OrderID))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'unknown-pm-1' AND recovery_point = 'finished' AND response_status = 402`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE order_id = ? AND outcome = 'rejected'`, p.OrderID))
	calls := len(h.emu.Requests())
	require.Equal(t, 1, calls, "one request, never retried")

	again := h.checkout("unknown-pm-1", body)
	require.Equal(t, string(r.body), string(again.body))
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))

	// A round of each background loop, with every lease long expired.
	require.NoError(t, h.db.Exec(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 hour'`).Error)
	c, err := sweep.NewCompleter(h.db, h.api.KeyStore, h.api.Service, sweep.CompleterConfig{Grace: time.Millisecond})
	require.NoError(t, err)
	round, err := c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{}, round)
	rec, err := sweep.NewReconciler(h.db, h.api.Service, sweep.ReconcilerConfig{})
	require.NoError(t, err)
	rr, err := rec.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.ReconcileRound{}, rr)
	require.Len(t, h.emu.Requests(), calls, "no further Stripe call for the order")
	require.Len(t, h.intents(p.OrderID), 0)
}

// threeDS starts a checkout that needs 3D Secure and checks its 202.
func threeDS(t *testing.T, h *harness, key string) orders.Order {
	t.Helper()
	r := h.checkout(key, threeDSBody)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	require.Equal(t, "/v1/orders/"+o.ID, r.header.Get("Location"))
	require.Equal(t, orders.RequiresAction, o.Status)
	require.Equal(t, stripeintent.RequiresAction, o.Payment.Status)
	require.Regexp(t, `^pi_`, o.Payment.PaymentIntentID)
	require.Regexp(t, `^`+o.Payment.PaymentIntentID+`_secret_`, o.Payment.ClientSecret)
	var next struct {
		Type string `json:"type"`
	}
	require.NoError(t, json.Unmarshal(o.Payment.NextAction, &next))
	require.Equal(t, "use_stripe_sdk", next.Type, "next_action as Stripe gave it")

	again := h.checkout(key, threeDSBody)
	require.Equal(t, http.StatusAccepted, again.status)
	require.Equal(t, string(r.body), string(again.body), "the 202 is stored and replayed")
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, r.header.Get("Location"), again.header.Get("Location"))
	return o
}

func (h *harness) reconciler(now func() time.Time) *sweep.Reconciler {
	h.t.Helper()
	rec, err := sweep.NewReconciler(h.db, h.api.Service, sweep.ReconcilerConfig{Now: now, Grace: time.Millisecond})
	require.NoError(h.t, err)
	return rec
}

// TestThreeDSecure: a card that needs authentication answers 202 with the
// order in requires_action (stock still reserved); the reconciler then
// settles it as Stripe says: paid once the customer authenticated,
// payment_failed with the stock back when authentication failed or when the
// customer did nothing for PAYMENT_ACTION_TIMEOUT (the PaymentIntent is then
// canceled at Stripe).
func TestThreeDSecure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		act        func(h *harness, clk *testenv.Clock, pi string)
		wantStatus string
		wantPI     stripe.PaymentIntentStatus
		wantEvent  string
		stockBack  bool
	}{
		{name: "authenticated", act: func(h *harness, _ *testenv.Clock, pi string) {
			_, err := h.emu.Authenticate(pi, true)
			require.NoError(h.t, err)
		}, wantStatus: string(orders.Paid), wantPI: stripe.PaymentIntentStatusSucceeded, wantEvent: "order.paid"},
		{name: "authentication failed", act: func(h *harness, _ *testenv.Clock, pi string) {
			_, err := h.emu.Authenticate(pi, false)
			require.NoError(h.t, err)
		}, wantStatus: string(orders.PaymentFailed), wantPI: stripe.PaymentIntentStatusCanceled,
			wantEvent: "order.payment_failed", stockBack: true},
		{name: "abandoned past the timeout", act: func(_ *harness, clk *testenv.Clock, _ string) {
			clk.Advance(31 * time.Minute)
		}, wantStatus: string(orders.PaymentFailed), wantPI: stripe.PaymentIntentStatusCanceled,
			wantEvent: "order.payment_failed", stockBack: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := &testenv.Clock{}
			h := setup(t, func(o *options) { o.now = clk.Now; o.saga = checkout.SagaConfig{ActionTimeout: 30 * time.Minute} })
			before := h.stock("sku_tee")
			o := threeDS(t, h, "3ds-"+tc.name)
			require.Equal(t, before-2, h.stock("sku_tee"), "reserved while the customer authenticates")

			// Nothing happened yet: a round changes nothing.
			rec := h.reconciler(clk.Now)
			round, err := rec.RunOnce(context.Background())
			require.NoError(t, err)
			require.Equal(t, sweep.ReconcileRound{Unchanged: 1}, round)
			require.Equal(t, string(orders.RequiresAction), h.order(o.ID).Status)

			tc.act(h, clk, o.Payment.PaymentIntentID)
			round, err = rec.RunOnce(context.Background())
			require.NoError(t, err)
			require.Equal(t, sweep.ReconcileRound{Changed: 1}, round)

			h.requirePaymentInvariants(o.ID, tc.wantStatus)
			pis := h.intents(o.ID)
			require.Len(t, pis, 1)
			require.Equal(t, tc.wantPI, pis[0].Status)
			if tc.wantStatus == string(orders.PaymentFailed) {
				// The customer, who holds the client_secret, tries another
				// card on the same PaymentIntent, as Stripe.js would.
				h.confirmRefused(o.Payment.PaymentIntentID, "pm_card_visa")
				h.requirePaymentInvariants(o.ID, tc.wantStatus, stripeemu.OpPIConfirm)
			}
			require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = ?`, o.ID, tc.wantEvent))
			if tc.stockBack {
				require.Equal(t, before, h.stock("sku_tee"), "stock returned")
			} else {
				require.Equal(t, before-2, h.stock("sku_tee"))
			}
			got := h.get("sk_test_acme", "/v1/orders/"+o.ID)
			require.Equal(t, tc.wantStatus, string(decodeOrder(t, got).Status))
			require.Empty(t, decodeOrder(t, got).Payment.ClientSecret, "the secret is shown only while action is required")

			// The 202 stays the key's stored answer; settling again changes nothing.
			again := h.checkout("3ds-"+tc.name, threeDSBody)
			require.Equal(t, http.StatusAccepted, again.status)
			round, err = rec.RunOnce(context.Background())
			require.NoError(t, err)
			require.Equal(t, sweep.ReconcileRound{}, round)
			require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = ?`, o.ID, tc.wantEvent))
		})
	}
}

// TestFailedChallengeThenAnotherCard: Stripe reports the 3D Secure
// challenge failed, and before the service acts on it the customer pays
// the same PaymentIntent with another card. Closing the failed attempt
// finds it succeeded (Stripe refuses to cancel it): the order is paid,
// with its stock kept and one order.paid, never payment_failed.
func TestFailedChallengeThenAnotherCard(t *testing.T) {
	t.Parallel()
	h := setup(t)
	before := h.stock("sku_tee")
	o := threeDS(t, h, "3ds-fail-then-pay")
	pi := o.Payment.PaymentIntentID
	_, err := h.emu.Authenticate(pi, false)
	require.NoError(t, err)
	failed, err := h.api.Service.Payments.RetrievePaymentIntent(context.Background(), pi)
	require.NoError(t, err)
	require.Equal(t, stripeintent.RequiresPaymentMethod, failed.Status)
	h.confirmAgain(pi, "pm_card_visa")

	// What a webhook or a poll that read Stripe before the second card
	// would apply.
	changed, err := h.api.Service.ApplyPaymentIntent(context.Background(), failed, nil)
	require.NoError(t, err)
	require.True(t, changed)
	h.requirePaymentInvariants(o.ID, string(orders.Paid), stripeemu.OpPICancel)
	require.Equal(t, before-2, h.stock("sku_tee"))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
	require.Zero(t, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, o.ID))
}

// cancelOrder posts POST /v1/orders/{id}/cancel as tenant acme with key;
// an empty body is sent without a Content-Type.
func (h *harness) cancelOrder(id, key, body string) reply {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/orders/"+id+"/cancel", strings.NewReader(body))
	require.NoError(h.t, err)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.Set("Idempotency-Key", key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return h.send(req)
}

// TestCancelOrder: POST /v1/orders/{id}/cancel cancels an order waiting for
// 3D Secure: the PaymentIntent canceled at Stripe, the stock back, the
// order canceled, order.canceled in the outbox; the 200 is stored and
// replayed; any other order (paid, already canceled) is 409
// order_not_cancelable; the same key for another order is 422.
func TestCancelOrder(t *testing.T) {
	t.Parallel()
	h := setup(t)
	before := h.stock("sku_tee")
	o := threeDS(t, h, "cancel-3ds-1")

	r := h.cancelOrder(o.ID, "cancel-1", "")
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	got := decodeOrder(t, r)
	require.Equal(t, orders.Canceled, got.Status)
	require.Equal(t, o.ID, got.ID)
	require.Equal(t, before, h.stock("sku_tee"), "stock returned")
	h.requirePaymentInvariants(o.ID, string(orders.Canceled))
	pis := h.intents(o.ID)
	require.Len(t, pis, 1)
	require.Equal(t, stripe.PaymentIntentStatusCanceled, pis[0].Status)
	require.Equal(t, stripe.PaymentIntentCancellationReasonRequestedByCustomer, pis[0].CancellationReason)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.canceled'`, o.ID))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, o.ID))

	again := h.cancelOrder(o.ID, "cancel-1", "{}")
	require.Equal(t, http.StatusOK, again.status)
	require.Equal(t, string(r.body), string(again.body), "replayed byte for byte")
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))

	notJSON := h.cancelOrder(o.ID, "cancel-1", "x")
	require.Equal(t, http.StatusBadRequest, notJSON.status, "a body, when there is one, is JSON")
	require.Equal(t, "malformed_json", decodeProblem(t, notJSON).Code)
	other := h.cancelOrder(o.ID, "cancel-2", "{}")
	require.Equal(t, http.StatusConflict, other.status, "%s", other.body)
	require.Equal(t, "order_not_cancelable", decodeProblem(t, other).Code)
	require.Equal(t, before, h.stock("sku_tee"), "stock returned once")

	paid := decodeOrder(t, h.checkout("cancel-paid-1", teeBody))
	r = h.cancelOrder(paid.ID, "cancel-3", "{}")
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, "order_not_cancelable", decodeProblem(t, r).Code)
	require.Equal(t, string(orders.Paid), h.order(paid.ID).Status)
	require.Equal(t, "true", h.cancelOrder(paid.ID, "cancel-3", "{}").header.Get(idempotency.ReplayedHeader))

	reused := h.cancelOrder(paid.ID, "cancel-1", "{}")
	require.Equal(t, http.StatusUnprocessableEntity, reused.status, "the key names the cancellation of another order: %s", reused.body)

	missing := h.cancelOrder("ord_"+strings.Repeat("0", 32), "cancel-4", "{}")
	require.Equal(t, http.StatusNotFound, missing.status)
	bad := h.cancelOrder(o.ID, "cancel-5", `{"reason":"x"}`)
	require.Equal(t, http.StatusBadRequest, bad.status)
	require.Equal(t, "validation_error", decodeProblem(t, bad).Code)
}

// TestCancelAfterCustomerAuthenticated: the customer authenticated just
// before the cancellation: Stripe refuses to cancel a succeeded
// PaymentIntent, so the order becomes paid and the answer is 409.
func TestCancelAfterCustomerAuthenticated(t *testing.T) {
	t.Parallel()
	h := setup(t)
	o := threeDS(t, h, "cancel-late-3ds")
	_, err := h.emu.Authenticate(o.Payment.PaymentIntentID, true)
	require.NoError(t, err)
	r := h.cancelOrder(o.ID, "cancel-late", "{}")
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, "order_not_cancelable", decodeProblem(t, r).Code)
	h.requirePaymentInvariants(o.ID, string(orders.Paid), stripeemu.OpPICancel)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
}

// TestFailedChallengeWebhookWhileStripeCannotCancel: the failed
// challenge's webhook arrives while Stripe refuses to cancel (503 past the
// client's retries): 502 payment_provider_unavailable, and nothing is
// recorded (no inbox row, the order still in requires_action with its stock
// held), so Stripe's redelivery, once Stripe answers, cancels the
// PaymentIntent and fails the order once.
func TestFailedChallengeWebhookWhileStripeCannotCancel(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.stripe = &payments.Config{Timeout: time.Second, MaxElapsed: 200 * time.Millisecond}
	})
	before := h.stock("sku_tee")
	o := threeDS(t, h, "3ds-fail-cancel-down")
	pi := o.Payment.PaymentIntentID
	_, err := h.emu.Authenticate(pi, false)
	require.NoError(t, err)
	_, failed := h.event(webhooks.TypePaymentIntentPaymentFailed, pi)
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPICancel, Status: 503}))

	r := h.deliverSigned(failed)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	require.Equal(t, "payment_provider_unavailable", decodeProblem(t, r).Code)
	require.Zero(t, h.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook'`))
	require.Equal(t, string(orders.RequiresAction), h.order(o.ID).Status)
	require.Equal(t, before-2, h.stock("sku_tee"), "stock still held")
	require.Zero(t, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, o.ID))

	h.emu.ClearFaults()
	require.Equal(t, webhooks.OutcomeApplied, webhookOutcome(t, h.deliverSigned(failed)))
	require.Equal(t, webhooks.OutcomeDuplicate, webhookOutcome(t, h.deliverSigned(failed)))
	h.requirePaymentInvariants(o.ID, string(orders.PaymentFailed), stripeemu.OpPIConfirm)
	require.Equal(t, stripe.PaymentIntentStatusCanceled, h.intents(o.ID)[0].Status)
	h.confirmRefused(pi, "pm_card_visa")
	require.Equal(t, before, h.stock("sku_tee"), "stock given back once")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, o.ID))
}

// TestConcurrentCancelsUnderDifferentKeys: ten cancellations of one order
// at once, each under its own key: exactly one is 200 and the others 409
// order_not_cancelable (as for any order no longer in requires_action),
// each stored; one cancel attempt at Stripe, one order.canceled, the stock
// back once.
func TestConcurrentCancelsUnderDifferentKeys(t *testing.T) {
	t.Parallel()
	h := setup(t)
	before := h.stock("sku_tee")
	o := threeDS(t, h, "cancel-race-3ds")
	// Stripe's cancel takes a while, so that the others arrive while the
	// first is under way.
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICancel, Before: 300 * time.Millisecond}))
	const n = 10
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = h.cancelOrder(o.ID, fmt.Sprintf("cancel-race-%d", i), "{}").status
		}()
	}
	wg.Wait()
	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	require.Equal(t, map[int]int{http.StatusOK: 1, http.StatusConflict: n - 1}, count)
	h.requirePaymentInvariants(o.ID, string(orders.Canceled))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.canceled'`, o.ID))
	require.Equal(t, 1, h.count(`SELECT count(DISTINCT idempotency_key) FROM payment_attempts WHERE order_id = ? AND step = 'cancel'`, o.ID))
	require.Equal(t, before, h.stock("sku_tee"), "stock given back once")
	for i := range n {
		// Each answer is stored: a retry replays it.
		again := h.cancelOrder(o.ID, fmt.Sprintf("cancel-race-%d", i), "{}")
		require.Equal(t, statuses[i], again.status)
		require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	}
}

// TestPaymentUnknown: a create answered by a stored 500 whose
// reconciliation keeps failing (search down) for PAYMENT_UNKNOWN_AFTER
// makes the order payment_unknown (counted in
// checkout_payments_unknown_total, shown by the reconciler's gauge); it is
// still reconciled, and once Stripe answers it is settled: paid, with one
// PaymentIntent.
func TestPaymentUnknown(t *testing.T) {
	t.Parallel()
	clk := &testenv.Clock{}
	h := setup(t, func(o *options) {
		o.now = clk.Now
		o.saga = checkout.SagaConfig{UnknownAfter: time.Hour}
		o.stripe = &payments.Config{Timeout: time.Second, MaxElapsed: 200 * time.Millisecond}
	})
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate, Count: 1}))
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPISearch, Status: 503}))
	r := h.checkout("unknown-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	var orderID string
	require.NoError(t, h.db.Raw(`SELECT order_id FROM idempotency_keys WHERE key = 'unknown-1'`).Scan(&orderID).Error)
	require.Equal(t, string(orders.PendingPayment), h.order(orderID).Status)

	clk.Advance(time.Hour)
	r = h.checkout("unknown-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	require.Equal(t, string(orders.PaymentUnknown), h.order(orderID).Status)
	require.EqualValues(t, 1, testutil.ToFloat64(gathered{h.registry.Registry, "checkout_payments_unknown_total", nil}))
	require.Zero(t, h.emu.TotalCreated(), "nothing created while the outcome is unknown")

	rec := h.reconciler(clk.Now)
	round, err := rec.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.ReconcileRound{Failed: 1}, round, "reconciled, still unknown")
	require.Equal(t, string(orders.PaymentUnknown), h.order(orderID).Status)

	h.emu.ClearFaults()
	round, err = rec.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.ReconcileRound{Changed: 1}, round)
	h.requirePaymentInvariants(orderID, string(orders.Paid))
	retry := h.checkout("unknown-1", teeBody)
	require.Equal(t, http.StatusCreated, retry.status, "%s", retry.body)
	require.Equal(t, "true", retry.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, fmt.Sprint(orderID), decodeOrder(t, retry).ID)
}

// TestApplyPaymentIntentMonotonic: "apply Stripe's state of PaymentIntent X"
// (what the reconciler does and a webhook handler will) moves an order only
// forward: applying the same state twice, an older state after a newer one,
// or the state of a PaymentIntent that is not the order's changes nothing
// and writes no second event.
func TestApplyPaymentIntentMonotonic(t *testing.T) {
	t.Parallel()
	h := setup(t)
	o := threeDS(t, h, "apply-1")
	c := payments.NewClient(payments.Config{APIBase: h.emuURL, SecretKey: "sk_test_123"}, nil, nil)
	waiting, err := c.RetrievePaymentIntent(t.Context(), o.Payment.PaymentIntentID)
	require.NoError(t, err)
	require.Equal(t, stripeintent.RequiresAction, waiting.Status)
	changed, err := h.api.Service.ApplyPaymentIntent(t.Context(), waiting, nil)
	require.NoError(t, err)
	require.False(t, changed, "already requires_action")

	_, err = h.emu.Authenticate(o.Payment.PaymentIntentID, true)
	require.NoError(t, err)
	succeeded, err := c.RetrievePaymentIntent(t.Context(), o.Payment.PaymentIntentID)
	require.NoError(t, err)
	changed, err = h.api.Service.ApplyPaymentIntent(t.Context(), succeeded, nil)
	require.NoError(t, err)
	require.True(t, changed)
	for _, pi := range []checkout.PaymentIntentState{succeeded, waiting} {
		changed, err = h.api.Service.ApplyPaymentIntent(t.Context(), pi, nil)
		require.NoError(t, err)
		require.False(t, changed, "%s after succeeded", pi.Status)
	}
	canceled := succeeded
	canceled.Status = stripeintent.Canceled
	changed, err = h.api.Service.ApplyPaymentIntent(t.Context(), canceled, nil)
	require.NoError(t, err)
	require.False(t, changed, "paid never goes back")

	// Another PaymentIntent naming the order in its metadata is not the
	// order's: nothing changes.
	other, err := c.CreatePaymentIntent(t.Context(), checkout.CreateIntentRequest{IdempotencyKey: "apply-other",
		Amount: 5000, Currency: "usd", PaymentMethod: "pm_card_chargeDeclined", OrderID: o.ID, TenantID: "acme"})
	require.NoError(t, err)
	other.Status, other.LastErrorCode = stripeintent.RequiresPaymentMethod, "card_declined"
	changed, err = h.api.Service.ApplyPaymentIntent(t.Context(), other, nil)
	require.NoError(t, err)
	require.False(t, changed)

	require.Equal(t, string(orders.Paid), h.order(o.ID).Status)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type IN ('order.payment_failed', 'order.canceled')`, o.ID))
}

// TestOrphanSweep: Stripe rolls a create answered with a 500 forward after
// the saga's own search looked (here 500ms later, with no search lag): the
// order is paid through a second create, and the PaymentIntent that appears
// afterwards is found by the reconciler's sweep and canceled, once.
func TestOrphanSweep(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate, Count: 1,
		RollForward: stripeemu.RollForwardAfter(500 * time.Millisecond)}))
	r := h.checkout("late-orphan-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	eventually(t, "Stripe to roll the first create forward", func() bool { return len(h.intents(o.ID)) == 2 })

	rec := h.reconciler(time.Now)
	round, err := rec.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.ReconcileRound{Orphans: 1}, round)
	pis := h.requirePaymentInvariants(o.ID, string(orders.Paid))
	require.Len(t, pis, 2)

	round, err = rec.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.ReconcileRound{}, round, "swept again only after ORPHAN_SWEEP_INTERVAL")
}

// scripted wraps the real client and lets a test replace single calls.
type scripted struct {
	checkout.PaymentProvider
	mu       sync.Mutex
	confirms int
	confirm  func(n int, req checkout.ConfirmIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error)
	retrieve func(real checkout.PaymentIntentState) checkout.PaymentIntentState
	creates  int
	create   func(n int, req checkout.CreateIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error)
}

func (s *scripted) CreatePaymentIntent(ctx context.Context, req checkout.CreateIntentRequest) (checkout.PaymentIntentState, error) {
	s.mu.Lock()
	s.creates++
	n := s.creates
	s.mu.Unlock()
	if s.create != nil {
		return s.create(n, req, s.PaymentProvider)
	}
	return s.PaymentProvider.CreatePaymentIntent(ctx, req)
}

func (s *scripted) ConfirmPaymentIntent(ctx context.Context, req checkout.ConfirmIntentRequest) (checkout.PaymentIntentState, error) {
	s.mu.Lock()
	s.confirms++
	n := s.confirms
	s.mu.Unlock()
	if s.confirm != nil {
		return s.confirm(n, req, s.PaymentProvider)
	}
	return s.PaymentProvider.ConfirmPaymentIntent(ctx, req)
}

func (s *scripted) RetrievePaymentIntent(ctx context.Context, id string) (checkout.PaymentIntentState, error) {
	pi, err := s.PaymentProvider.RetrievePaymentIntent(ctx, id)
	s.mu.Lock()
	f := s.retrieve
	s.mu.Unlock()
	if err == nil && f != nil {
		pi = f(pi)
	}
	return pi, err
}

// TestConfirmRefusedAfterRollForward: the first confirm is answered with a
// stored 500 and Stripe rolls it forward just after the saga read the
// PaymentIntent (still unconfirmed): the saga's second confirm is refused
// (400 payment_intent_unexpected_state, the PaymentIntent has succeeded).
// A refusal at confirm is checked against Stripe's state before it is
// taken as final: the order is paid, as at Stripe, never payment_failed.
func TestConfirmRefusedAfterRollForward(t *testing.T) {
	t.Parallel()
	s := &scripted{}
	s.confirm = func(n int, req checkout.ConfirmIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error) {
		ctx := context.Background()
		if n == 1 {
			return checkout.PaymentIntentState{}, fmt.Errorf("stripe confirm: %w: stripe 500 api_error", stripestep.ErrIndeterminate)
		}
		// Stripe's remediation executes the first confirm now.
		if _, err := real.ConfirmPaymentIntent(ctx, checkout.ConfirmIntentRequest{IdempotencyKey: "rolled-forward", PaymentIntentID: req.PaymentIntentID}); err != nil {
			return checkout.PaymentIntentState{}, err
		}
		return real.ConfirmPaymentIntent(ctx, req)
	}
	h := setup(t, func(o *options) {
		o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider { s.PaymentProvider = p; return s }
	})
	r := h.checkout("refused-confirm-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	h.requirePaymentInvariants(o.ID, string(orders.Paid), stripeemu.OpPIConfirm)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE order_id = ? AND step = 'confirm' AND outcome = 'rejected'`, o.ID))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, o.ID))
}

// TestPaymentStillProcessing: a PaymentIntent that is processing (or
// requires_capture) may still move money, so the order is settled neither
// way: 502, the order pending, the stock still reserved; once Stripe says
// succeeded, the retry settles it paid.
func TestPaymentStillProcessing(t *testing.T) {
	t.Parallel()
	s := &scripted{}
	processing := func(pi checkout.PaymentIntentState) checkout.PaymentIntentState {
		if pi.Status == stripeintent.Succeeded {
			pi.Status = stripeintent.Processing
		}
		return pi
	}
	s.confirm = func(_ int, req checkout.ConfirmIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error) {
		pi, err := real.ConfirmPaymentIntent(context.Background(), req)
		return processing(pi), err
	}
	s.retrieve = processing
	h := setup(t, func(o *options) {
		o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider { s.PaymentProvider = p; return s }
	})
	before := h.stock("sku_tee")
	r := h.checkout("processing-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	require.Equal(t, "payment_provider_unavailable", decodeProblem(t, r).Code)
	var orderID string
	require.NoError(t, h.db.Raw(`SELECT order_id FROM idempotency_keys WHERE key = 'processing-1'`).Scan(&orderID).Error)
	require.Equal(t, string(orders.PendingPayment), h.order(orderID).Status)
	require.Equal(t, before-2, h.stock("sku_tee"), "still reserved")
	require.Equal(t, http.StatusBadGateway, h.checkout("processing-1", teeBody).status, "still processing")

	s.mu.Lock()
	s.retrieve = nil
	s.mu.Unlock()
	r = h.checkout("processing-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	h.requirePaymentInvariants(orderID, string(orders.Paid))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE order_id = ? AND step = 'confirm'`, orderID), "confirmed once")
}

// TestEveryCreateIndeterminate: Stripe answers every create with a stored
// 500 that it never executes. Each attempt is reconciled (search: nothing)
// before the next, a run stops after MaxAttempts new attempts (502), and
// the next run goes on; once Stripe recovers, one PaymentIntent is created
// and paid.
func TestEveryCreateIndeterminate(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.saga = checkout.SagaConfig{MaxAttempts: 3} })
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate}))
	r := h.checkout("all-500-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	require.Equal(t, 3, h.count(`SELECT count(*) FROM payment_attempts WHERE step = 'create' AND outcome = 'indeterminate'`))
	searches := 0
	for _, rq := range h.emu.Requests() {
		if rq.Op == stripeemu.OpPISearch {
			searches++
		}
	}
	require.Equal(t, 3, searches, "every indeterminate attempt is reconciled before the next")

	h.emu.ClearFaults()
	r = h.checkout("all-500-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	pis := h.requirePaymentInvariants(o.ID, string(orders.Paid))
	require.Len(t, pis, 1)
	require.Equal(t, 4, h.count(`SELECT count(*) FROM payment_attempts WHERE step = 'create'`))
}

// TestCancelResumedByCompleter: Stripe is down when the customer cancels
// (502, the key at cancel_requested); nobody retries, and the worker's
// completer finishes the cancellation through the same saga: the
// PaymentIntent canceled, the order canceled with its stock back, and the
// client's later retry gets the stored 200.
func TestCancelResumedByCompleter(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.stripe = &payments.Config{Timeout: time.Second, MaxElapsed: 100 * time.Millisecond}
	})
	before := h.stock("sku_tee")
	o := threeDS(t, h, "cancel-resume-3ds")
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPICancel, Status: 503}))
	r := h.cancelOrder(o.ID, "cancel-resume", "{}")
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'cancel-resume' AND recovery_point = ?`, checkout.RecoveryPointCancelRequested))
	require.Equal(t, string(orders.RequiresAction), h.order(o.ID).Status)

	h.emu.ClearFaults()
	require.NoError(t, h.db.Exec(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 hour' WHERE key = 'cancel-resume'`).Error)
	c, err := sweep.NewCompleter(h.db, h.api.KeyStore, h.api.Service, sweep.CompleterConfig{Grace: time.Millisecond})
	require.NoError(t, err)
	round, err := c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Completed: 1}, round)

	h.requirePaymentInvariants(o.ID, string(orders.Canceled))
	require.Equal(t, before, h.stock("sku_tee"))
	retry := h.cancelOrder(o.ID, "cancel-resume", "{}")
	require.Equal(t, http.StatusOK, retry.status, "%s", retry.body)
	require.Equal(t, "true", retry.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, orders.Canceled, decodeOrder(t, retry).Status)
}

// TestCheckoutKeyFinishesAfterTheOrderWasRefunded: the checkout's answer
// was lost in doubt (Stripe said processing: 502, the key unfinished), the
// webhook then made the order paid and the merchant refunded part of it.
// The key still finishes with the outcome of its payment (CONTRACT.md v3):
// the completer stores 201 with the order as it is (partially_refunded),
// and the client's retry replays it, rather than 502 for ever.
func TestCheckoutKeyFinishesAfterTheOrderWasRefunded(t *testing.T) {
	t.Parallel()
	s := &scripted{}
	processing := func(pi checkout.PaymentIntentState) checkout.PaymentIntentState {
		if pi.Status == stripeintent.Succeeded {
			pi.Status = stripeintent.Processing
		}
		return pi
	}
	s.confirm = func(_ int, req checkout.ConfirmIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error) {
		pi, err := real.ConfirmPaymentIntent(context.Background(), req)
		return processing(pi), err
	}
	s.retrieve = processing
	h := setup(t, func(o *options) {
		o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider { s.PaymentProvider = p; return s }
	})
	r := h.checkout("refunded-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	var key struct {
		ID      int64
		OrderID string
	}
	require.NoError(t, h.db.Raw(`SELECT id, order_id FROM idempotency_keys WHERE key = 'refunded-1'`).Scan(&key).Error)
	s.mu.Lock()
	s.retrieve = nil
	s.mu.Unlock()

	// What the webhook does once Stripe says succeeded, then a refund.
	pi, err := s.RetrievePaymentIntent(context.Background(), *h.order(key.OrderID).PaymentIntentID)
	require.NoError(t, err)
	changed, err := h.api.Service.ApplyPaymentIntent(context.Background(), pi, nil)
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, refunds.StatusSucceeded, decodeRefund(t, h.refund(key.OrderID, "refund-1", `{"amount":1000}`)).Status)
	require.Equal(t, string(orders.PartiallyRefunded), h.order(key.OrderID).Status)

	require.NoError(t, h.db.Exec(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 hour' WHERE id = ?`, key.ID).Error)
	done, err := h.api.Service.Complete(context.Background(), key.ID)
	require.NoError(t, err)
	require.True(t, done, "the completer finishes the key")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE id = ? AND recovery_point = 'finished' AND response_status = 201`, key.ID))

	retry := h.checkout("refunded-1", teeBody)
	require.Equal(t, http.StatusCreated, retry.status, "%s", retry.body)
	require.Equal(t, "true", retry.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, "/v1/orders/"+key.OrderID, retry.header.Get("Location"))
	o := decodeOrder(t, retry)
	require.Equal(t, key.OrderID, o.ID)
	require.Equal(t, orders.PartiallyRefunded, o.Status, "the order as it is")
	require.Len(t, h.intents(key.OrderID), 1, "one PaymentIntent, charged once")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE order_id = ? AND step = 'confirm'`, key.OrderID), "confirmed once")
}
