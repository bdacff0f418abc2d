package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/api"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/testenv"
	"github.com/onceonly/checkout/internal/webhooks"
)

// refund posts body to /v1/orders/{orderID}/refunds as tenant acme.
func (h *harness) refund(orderID, key, body string) reply {
	h.t.Helper()
	return h.post("sk_test_acme", "/v1/orders/"+orderID+"/refunds", key, body)
}

func (h *harness) post(apiKey, path, key, body string) reply {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+path, bytes.NewBufferString(body))
	require.NoError(h.t, err)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	return h.send(req)
}

// paidOrder checks out two tees (5000) and returns the paid order's id and
// PaymentIntent.
func (h *harness) paidOrder() (orderID, paymentIntentID string) {
	h.t.Helper()
	r := h.checkout("order-"+testenv.Random(8), teeBody)
	require.Equal(h.t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(h.t, r)
	return o.ID, o.Payment.PaymentIntentID
}

func decodeRefund(t testing.TB, r reply) refunds.Refund {
	t.Helper()
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var rf refunds.Refund
	require.NoError(t, json.Unmarshal(r.body, &rf), "body: %s", r.body)
	return rf
}

// orderView is GET /v1/orders/{id} as the refund tests read it.
type orderView struct {
	Status         string           `json:"status"`
	AmountRefunded int64            `json:"amount_refunded"`
	Refunds        []refunds.Refund `json:"refunds"`
}

func (h *harness) orderView(orderID string) orderView {
	h.t.Helper()
	r := h.get("sk_test_acme", "/v1/orders/"+orderID)
	require.Equal(h.t, http.StatusOK, r.status, "%s", r.body)
	var v orderView
	require.NoError(h.t, json.Unmarshal(r.body, &v))
	return v
}

// stripeRefunds returns the emulator's refunds of paymentIntentID.
func (h *harness) stripeRefunds(paymentIntentID string) []refundAtStripe {
	h.t.Helper()
	var out []refundAtStripe
	for _, r := range h.emu.Refunds() {
		if r.PaymentIntent != nil && r.PaymentIntent.ID == paymentIntentID {
			out = append(out, refundAtStripe{ID: r.ID, Amount: r.Amount, Status: string(r.Status), RefundID: r.Metadata["refund_id"]})
		}
	}
	return out
}

type refundAtStripe struct {
	ID, Status, RefundID string
	Amount               int64
}

func requireReplay(t testing.TB, first, again reply) {
	t.Helper()
	require.Equal(t, first.status, again.status)
	require.Equal(t, string(first.body), string(again.body))
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	require.Empty(t, first.header.Get(idempotency.ReplayedHeader))
}

// TestRefundWithAnEmptyBody: both of a refund's fields are optional, so an
// empty body, with or without a Content-Type, refunds the rest like {}: one
// refund at Stripe, and the same key with {} or with nothing is its replay.
func TestRefundWithAnEmptyBody(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/orders/"+orderID+"/refunds", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.Set("Idempotency-Key", "refund-empty")
	first := h.send(req)
	rf := decodeRefund(t, first)
	require.Equal(t, int64(5000), rf.Amount, "the rest of what was paid")
	requireReplay(t, first, h.refund(orderID, "refund-empty", ""))
	requireReplay(t, first, h.refund(orderID, "refund-empty", "{}"))
	require.Len(t, h.stripeRefunds(pi), 1)
}

// TestRefundPartialThenFull: a partial refund, its replay, then the rest;
// the order follows (partially_refunded, refunded), Stripe holds exactly two
// refunds with our ids, one order.refunded per refund, sequenced after
// order.paid, and a third refund finds nothing to refund.
func TestRefundPartialThenFull(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()

	first := h.refund(orderID, "refund-1", `{"amount":1500,"reason":"requested_by_customer"}`)
	rf1 := decodeRefund(t, first)
	require.Equal(t, refunds.StatusSucceeded, rf1.Status)
	require.EqualValues(t, 1500, rf1.Amount)
	require.Equal(t, "usd", rf1.Currency)
	require.Equal(t, orderID, rf1.OrderID)
	require.Equal(t, "requested_by_customer", *rf1.Reason)
	requireReplay(t, first, h.refund(orderID, "refund-1", `{"reason":"requested_by_customer", "amount":1500}`))

	v := h.orderView(orderID)
	require.Equal(t, "partially_refunded", v.Status)
	require.EqualValues(t, 1500, v.AmountRefunded)
	require.Len(t, v.Refunds, 1)

	rest := decodeRefund(t, h.refund(orderID, "refund-2", `{}`))
	require.EqualValues(t, 3500, rest.Amount, "no amount: the rest")
	require.Nil(t, rest.Reason)
	v = h.orderView(orderID)
	require.Equal(t, "refunded", v.Status)
	require.EqualValues(t, 5000, v.AmountRefunded)
	require.Len(t, v.Refunds, 2)

	again := h.refund(orderID, "refund-3", `{"amount":1}`)
	require.Equal(t, http.StatusConflict, again.status)
	require.Equal(t, "order_not_refundable", decodeProblem(t, again).Code)

	at := h.stripeRefunds(pi)
	require.Len(t, at, 2)
	require.ElementsMatch(t, []string{rf1.ID, rest.ID}, []string{at[0].RefundID, at[1].RefundID})
	require.ElementsMatch(t, []string{*rf1.StripeRefundID, *rest.StripeRefundID}, []string{at[0].ID, at[1].ID})

	var events []struct {
		Type         string
		AggregateSeq int64
	}
	require.NoError(t, h.db.Raw(`SELECT type, aggregate_seq FROM outbox WHERE aggregate_id = ? ORDER BY aggregate_seq`, orderID).Scan(&events).Error)
	require.Len(t, events, 4)
	require.Equal(t, []string{"order.created", "order.paid", "order.refunded", "order.refunded"},
		[]string{events[0].Type, events[1].Type, events[2].Type, events[3].Type})
	for i, e := range events {
		require.EqualValues(t, i+1, e.AggregateSeq)
	}
	require.Equal(t, 2, h.count(`SELECT count(*) FROM payment_attempts WHERE order_id = ? AND step LIKE 'refund:%' AND outcome = 'succeeded'`, orderID))
}

// TestRefundOfAnOrderThatIsNotPaid: a declined order and an unpaid one
// answer 409 order_not_refundable, stored and replayed; nothing reaches
// Stripe. Another tenant's or an unknown order is 404, not stored.
func TestRefundOfAnOrderThatIsNotPaid(t *testing.T) {
	t.Parallel()
	h := setup(t)
	declined := h.checkout("declined", declinedBody)
	require.Equal(t, http.StatusPaymentRequired, declined.status)
	declinedID := decodeProblem(t, declined).OrderID

	unpaidID := "ord_" + fmt.Sprintf("%032x", 42)
	require.NoError(t, h.db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES (?, 'acme', 'pending_payment', 'a@example.com', 'usd', 5000, 'pm_card_visa', now(), now())`, unpaidID).Error)

	for _, id := range []string{declinedID, unpaidID} {
		first := h.refund(id, "r-"+id, `{"amount":100}`)
		require.Equal(t, http.StatusConflict, first.status, "%s", first.body)
		require.Equal(t, "order_not_refundable", decodeProblem(t, first).Code)
		requireReplay(t, first, h.refund(id, "r-"+id, `{"amount":100}`))
	}
	paidID, _ := h.paidOrder()
	other := h.post("sk_test_globex", "/v1/orders/"+paidID+"/refunds", "r-globex", `{"amount":100}`)
	require.Equal(t, http.StatusNotFound, other.status)
	require.Equal(t, "not_found", decodeProblem(t, other).Code)
	missing := h.refund("ord_"+fmt.Sprintf("%032x", 7), "r-missing", `{}`)
	require.Equal(t, http.StatusNotFound, missing.status)
	require.Equal(t, 0, h.count(`SELECT count(*) FROM idempotency_keys WHERE key IN ('r-globex', 'r-missing')`), "404 is not stored")
	require.Empty(t, h.emu.Refunds())
	require.Equal(t, 0, h.count(`SELECT count(*) FROM refunds`))
}

// TestRefundBeyondWhatIsLeft: more than was paid, then more than is left
// after a partial refund: 409 refund_exceeds_payment, stored and replayed.
// Validation errors are 400 and not stored, so the fixed request succeeds
// with the same key; the same key for another order is 422.
func TestRefundBeyondWhatIsLeft(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()

	over := h.refund(orderID, "too-much", `{"amount":5001}`)
	require.Equal(t, http.StatusConflict, over.status, "%s", over.body)
	require.Equal(t, "refund_exceeds_payment", decodeProblem(t, over).Code)
	requireReplay(t, over, h.refund(orderID, "too-much", `{"amount":5001}`))

	decodeRefund(t, h.refund(orderID, "part", `{"amount":4000}`))
	left := h.refund(orderID, "left", `{"amount":1001}`)
	require.Equal(t, http.StatusConflict, left.status)
	require.Equal(t, "refund_exceeds_payment", decodeProblem(t, left).Code)

	for _, body := range []string{`{"amount":0}`, `{"amount":-5}`, `{"amount":"10"}`, `{"amount":1.5}`, `{"reason":"because"}`, `{"amount":10,"currency":"eur"}`, `[]`} {
		r := h.refund(orderID, "fix-me", body)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r.body)
		require.Equal(t, "validation_error", decodeProblem(t, r).Code, body)
	}
	fixed := decodeRefund(t, h.refund(orderID, "fix-me", `{"amount":1000,"reason":"duplicate"}`))
	require.EqualValues(t, 1000, fixed.Amount)

	otherID, _ := h.paidOrder()
	reused := h.refund(otherID, "fix-me", `{"amount":1000,"reason":"duplicate"}`)
	require.Equal(t, http.StatusUnprocessableEntity, reused.status, "the same key for another order is another request")
	require.Len(t, h.stripeRefunds(pi), 2)
	require.Equal(t, "refunded", h.orderView(orderID).Status)
}

// TestSameRefundKeyFiftyTimesAtOnce: one Stripe refund, one answer: every
// request gets the same 201 (first or replayed) or 409 in use, and a retry
// after the in-use answers gets the replay.
func TestSameRefundKeyFiftyTimesAtOnce(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpRefundCreate, Count: 1, Before: 300 * time.Millisecond}))

	const n = 50
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = h.refund(orderID, "same", `{"amount":1200}`)
		}()
	}
	wg.Wait()
	var body string
	created := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			if body == "" {
				body = string(r.body)
			}
			require.Equal(t, body, string(r.body))
			if r.header.Get(idempotency.ReplayedHeader) == "" {
				created++
			}
		case http.StatusConflict:
			require.Equal(t, "idempotency_key_in_use", decodeProblem(t, r).Code)
		default:
			t.Fatalf("unexpected %d %s", r.status, r.body)
		}
	}
	require.LessOrEqual(t, created, 1)
	final := h.refund(orderID, "same", `{"amount":1200}`)
	require.Equal(t, http.StatusCreated, final.status)
	if body != "" {
		require.Equal(t, body, string(final.body))
	}
	require.Len(t, h.stripeRefunds(pi), 1)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM refunds WHERE order_id = ?`, orderID))
	require.EqualValues(t, 1200, h.orderView(orderID).AmountRefunded)
}

// TestConcurrentRefundsNeverExceedThePayment: 20 refunds of 1000 with
// different keys at once on an order of 5000: each is answered 201 or 409
// (refund_exceeds_payment, or order_not_refundable once it is refunded),
// and what succeeded adds up to at most 5000, at Stripe as here.
func TestConcurrentRefundsNeverExceedThePayment(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()

	const n = 20
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = h.refund(orderID, fmt.Sprintf("race-%d", i), `{"amount":1000}`)
		}()
	}
	wg.Wait()
	var sum int64
	ok := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			rf := decodeRefund(t, r)
			require.Equal(t, refunds.StatusSucceeded, rf.Status)
			sum += rf.Amount
			ok++
		case http.StatusConflict:
			// refund_exceeds_payment while others are pending;
			// order_not_refundable once the order is refunded.
			require.Contains(t, []string{"refund_exceeds_payment", "order_not_refundable"}, decodeProblem(t, r).Code)
		default:
			t.Fatalf("unexpected %d %s", r.status, r.body)
		}
	}
	require.LessOrEqual(t, sum, int64(5000))
	require.Equal(t, 5, ok, "the lock serializes them: exactly what was paid")
	var atStripe int64
	for _, r := range h.stripeRefunds(pi) {
		atStripe += r.Amount
	}
	require.Equal(t, sum, atStripe)
	v := h.orderView(orderID)
	require.Equal(t, sum, v.AmountRefunded)
	require.Equal(t, "refunded", v.Status)
}

// TestRefundDatabaseRefusesOverReservation: the CHECK constraint backs the
// row lock: succeeded refunds beyond amount_total fail in the database
// itself (a reservation beyond it is allowed since migration 00020: refunds
// in doubt may outlast a refund made outside the service).
func TestRefundDatabaseRefusesOverReservation(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, _ := h.paidOrder()
	err := h.db.Exec(`UPDATE orders SET refund_reserved = amount_total + 1, amount_refunded = amount_total + 1 WHERE id = ?`, orderID).Error
	require.ErrorContains(t, err, "orders_refunds_within_total")
}

// TestRefundStored500: Stripe answers the refund create with a 500 it
// stores under the key. (a) Never executed: the retry reconciles (nothing
// at Stripe), answers 502 until REFUND_RETRY_AFTER, then 201 with the
// refund parked requires_attention: never a second create, no refund at
// Stripe. (b) Rolled forward at once: the first request already finds it
// by listing: one refund, first answer 201. (c) Rolled forward later,
// within the window: 502s until it appears, then it is adopted: one
// refund, never a second create.
func TestRefundStored500(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		rollForward *time.Duration
		retryAfter  time.Duration
		firstStatus int
	}{
		{"never executed", nil, 500 * time.Millisecond, http.StatusBadGateway},
		{"rolled forward at once", stripeemu.RollForwardAfter(0), time.Hour, http.StatusCreated},
		{"rolled forward later", stripeemu.RollForwardAfter(700 * time.Millisecond), time.Hour, http.StatusBadGateway},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t, func(o *options) { o.refundRetryAfter = tc.retryAfter })
			orderID, pi := h.paidOrder()
			require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpRefundCreate, Count: 1, RollForward: tc.rollForward}))

			first := h.refund(orderID, "k", `{"amount":2000}`)
			require.Equal(t, tc.firstStatus, first.status, "%s", first.body)
			final := first
			deadline := time.Now().Add(15 * time.Second)
			for final.status != http.StatusCreated {
				require.Equal(t, http.StatusBadGateway, final.status, "%s", final.body)
				require.Equal(t, "payment_provider_unavailable", decodeProblem(t, final).Code)
				require.True(t, time.Now().Before(deadline), "no final answer")
				time.Sleep(50 * time.Millisecond)
				final = h.refund(orderID, "k", `{"amount":2000}`)
			}
			rf := decodeRefund(t, final)
			// A later roll-forward of the first attempt would show here.
			time.Sleep(800 * time.Millisecond)
			require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE step = ?`, "refund:"+rf.ID), "one attempt, one key")
			var outcomes []string
			require.NoError(t, h.db.Raw(`SELECT outcome FROM payment_attempts WHERE step = ? ORDER BY attempt`, "refund:"+rf.ID).Scan(&outcomes).Error)
			reconciled := func(result string) float64 {
				return testutil.ToFloat64(gathered{h.registry.Registry, "checkout_refund_reconciliations_total", map[string]string{"result": result}})
			}
			at := h.stripeRefunds(pi)
			if tc.rollForward == nil {
				require.Equal(t, refunds.StatusRequiresAttention, rf.Status)
				require.Nil(t, rf.StripeRefundID)
				require.Empty(t, at, "never sent again under a new key")
				require.Equal(t, []string{"indeterminate"}, outcomes)
				require.Equal(t, 1.0, reconciled(refunds.ReconcileParked))
				require.EqualValues(t, 0, h.orderView(orderID).AmountRefunded)
				return
			}
			require.Equal(t, refunds.StatusSucceeded, rf.Status)
			require.Len(t, at, 1, "one refund at Stripe")
			require.Equal(t, *rf.StripeRefundID, at[0].ID)
			require.EqualValues(t, 2000, h.orderView(orderID).AmountRefunded)
			require.Equal(t, []string{"succeeded"}, outcomes, "the one attempt, reconciled")
			require.Equal(t, 1.0, reconciled(refunds.ReconcileFound))
			require.Zero(t, reconciled(refunds.ReconcileParked))
		})
	}
}

// TestRefundFailedLaterGivesItsAmountBack: a refund Stripe leaves pending
// counts against what can be refunded and changes no status; when Stripe
// fails it (seen by polling), its amount is refundable again and a new
// refund takes it.
func TestRefundFailedLaterGivesItsAmountBack(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()
	h.emu.SetRefundsPending(true)

	pending := decodeRefund(t, h.refund(orderID, "all", `{}`))
	require.Equal(t, refunds.StatusPending, pending.Status)
	require.EqualValues(t, 5000, pending.Amount)
	v := h.orderView(orderID)
	require.Equal(t, "paid", v.Status, "a pending refund changes no status")
	require.EqualValues(t, 0, v.AmountRefunded)
	blocked := h.refund(orderID, "more", `{"amount":1}`)
	require.Equal(t, http.StatusConflict, blocked.status)
	require.Equal(t, "refund_exceeds_payment", decodeProblem(t, blocked).Code)

	_, err := h.emu.FailRefund(*pending.StripeRefundID, "")
	require.NoError(t, err)
	changed, err := h.api.Refunds.PollPending(context.Background(), 0, 100)
	require.NoError(t, err)
	require.Equal(t, 1, changed)
	v = h.orderView(orderID)
	require.Equal(t, "paid", v.Status)
	require.EqualValues(t, 0, v.AmountRefunded)
	require.Equal(t, refunds.StatusFailed, v.Refunds[0].Status)
	require.NotNil(t, v.Refunds[0].FailureReason)

	h.emu.SetRefundsPending(false)
	again := decodeRefund(t, h.refund(orderID, "again", `{}`))
	require.EqualValues(t, 5000, again.Amount)
	require.Equal(t, refunds.StatusSucceeded, again.Status)
	require.Equal(t, "refunded", h.orderView(orderID).Status)
	require.Len(t, h.stripeRefunds(pi), 2)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.refunded'`, orderID), "only the succeeded refund is announced")
}

// TestPendingRefundSucceedsByPolling: Stripe settles a pending refund
// later; the poller applies it once, and order.refunded is written once.
func TestPendingRefundSucceedsByPolling(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, _ := h.paidOrder()
	h.emu.SetRefundsPending(true)
	rf := decodeRefund(t, h.refund(orderID, "p", `{"amount":500}`))
	_, err := h.emu.SucceedRefund(*rf.StripeRefundID)
	require.NoError(t, err)
	for range 2 {
		_, err := h.api.Refunds.PollPending(context.Background(), 0, 100)
		require.NoError(t, err)
	}
	st, err := h.api.Refunds.ApplyStripeRefund(context.Background(), refunds.StripeRefund{ID: *rf.StripeRefundID, Status: "pending"})
	require.NoError(t, err)
	require.False(t, st, "an older state changes nothing")
	v := h.orderView(orderID)
	require.Equal(t, "partially_refunded", v.Status)
	require.EqualValues(t, 500, v.AmountRefunded)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.refunded'`, orderID))
}

// TestRefundDefaultRetryAfterOutlastsALateRollForward: with
// REFUND_RETRY_AFTER at its default (24h), a refund create that Stripe
// answered with a stored 500 gets no new attempt two hours later while
// Stripe has not rolled it forward: its requests keep answering 502 with
// one create sent. Once Stripe rolls it forward, a retry adopts it: one
// refund at Stripe. (With the former default, 1m, the retry two hours
// later sent a second create, and the roll-forward made a second refund.)
func TestRefundDefaultRetryAfterOutlastsALateRollForward(t *testing.T) {
	t.Parallel()
	clk := &testenv.Clock{}
	h := setup(t, func(o *options) { o.now = clk.Now })
	orderID, pi := h.paidOrder()
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpRefundCreate, Count: 1,
		RollForward: stripeemu.RollForwardAfter(2 * time.Second)}))
	creates := func() int {
		n := 0
		for _, r := range h.emu.Requests() {
			if r.Op == stripeemu.OpRefundCreate {
				n++
			}
		}
		return n
	}

	first := h.refund(orderID, "late-roll", `{"amount":2000}`)
	require.Equal(t, http.StatusBadGateway, first.status, "%s", first.body)
	clk.Advance(2 * time.Hour)
	again := h.refund(orderID, "late-roll", `{"amount":2000}`)
	require.Equal(t, http.StatusBadGateway, again.status, "%s", again.body)
	require.Equal(t, 1, creates(), "no new attempt while Stripe may still roll the first forward")
	require.Empty(t, h.stripeRefunds(pi))

	var final reply
	eventually(t, "the rolled-forward refund is adopted", func() bool {
		final = h.refund(orderID, "late-roll", `{"amount":2000}`)
		return final.status == http.StatusCreated
	})
	require.Equal(t, refunds.StatusSucceeded, decodeRefund(t, final).Status)
	require.Equal(t, 1, creates())
	require.Len(t, h.stripeRefunds(pi), 1, "one refund at Stripe")
	require.EqualValues(t, 2000, h.orderView(orderID).AmountRefunded)
}

// TestCompleterFinishesARefundWhoseRequestDied: the refund's request got a
// 502 (a stored 500 that never ran) and the client never retries. The
// worker's completer, through api.Completer, takes the key over,
// reconciles until REFUND_RETRY_AFTER, then finishes it with the refund
// parked requires_attention, never sending it under a new key; the
// client's late retry is a replay. No refund at Stripe, one create sent.
func TestCompleterFinishesARefundWhoseRequestDied(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.refundRetryAfter = 300 * time.Millisecond })
	orderID, pi := h.paidOrder()
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpRefundCreate, Count: 1}))
	first := h.refund(orderID, "died", `{"amount":700}`)
	require.Equal(t, http.StatusBadGateway, first.status, "%s", first.body)

	var keyID int64
	require.NoError(t, h.db.Raw(`SELECT id FROM idempotency_keys WHERE key = 'died'`).Scan(&keyID).Error)
	completer := api.Completer(h.db, h.api.Service, h.api.Refunds)
	eventually(t, "the completer finishes the refund", func() bool {
		done, _ := completer.Complete(context.Background(), keyID)
		return done
	})
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE id = ? AND recovery_point = 'finished' AND response_status = 201`, keyID))
	late := h.refund(orderID, "died", `{"amount":700}`)
	require.Equal(t, http.StatusCreated, late.status)
	require.Equal(t, "true", late.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, refunds.StatusRequiresAttention, decodeRefund(t, late).Status)
	require.Empty(t, h.stripeRefunds(pi))
	require.Equal(t, 1, h.refundCreates())
	require.EqualValues(t, 0, h.orderView(orderID).AmountRefunded)
}

// refundCreates counts the refund creates the emulator received.
func (h *harness) refundCreates() int {
	n := 0
	for _, r := range h.emu.Requests() {
		if r.Op == stripeemu.OpRefundCreate {
			n++
		}
	}
	return n
}

// TestRefundParkedThenAdoptedWhenStripeRollsItForward: Stripe stores a 500
// for the refund create and rolls it forward only after
// REFUND_RETRY_AFTER. The refund is parked requires_attention (201, counted
// by checkout_refunds_requiring_attention, its amount still reserved),
// never created again under a new key; when the late roll-forward shows up,
// the refund reconciler adopts it: succeeded, the order partially
// refunded, the gauge back to 0. One create sent, one refund at Stripe.
func TestRefundParkedThenAdoptedWhenStripeRollsItForward(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.refundRetryAfter = 200 * time.Millisecond })
	orderID, pi := h.paidOrder()
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpRefundCreate, Count: 1,
		RollForward: stripeemu.RollForwardAfter(3 * time.Second)}))
	parkedGauge := gathered{h.registry.Registry, "checkout_refunds_requiring_attention", nil}

	var final reply
	eventually(t, "the refund is parked", func() bool {
		final = h.refund(orderID, "parked", `{"amount":2000}`)
		return final.status == http.StatusCreated
	})
	rf := decodeRefund(t, final)
	require.Equal(t, refunds.StatusRequiresAttention, rf.Status)
	require.Empty(t, h.stripeRefunds(pi), "parked before Stripe rolled it forward")
	require.Equal(t, refunds.StatusRequiresAttention, h.orderView(orderID).Refunds[0].Status)
	rest := h.refund(orderID, "rest", `{"amount":3001}`)
	require.Equal(t, http.StatusConflict, rest.status, "%s", rest.body)
	require.Equal(t, "refund_exceeds_payment", decodeProblem(t, rest).Code, "its amount stays reserved")

	adopted, err := h.api.Refunds.ReconcileParked(context.Background(), 0, 100)
	require.NoError(t, err)
	require.Zero(t, adopted, "not at Stripe yet")
	require.Equal(t, 1.0, testutil.ToFloat64(parkedGauge))

	eventually(t, "Stripe rolls the stored 500 forward", func() bool { return len(h.stripeRefunds(pi)) == 1 })
	adopted, err = h.api.Refunds.ReconcileParked(context.Background(), 0, 100)
	require.NoError(t, err)
	require.Equal(t, 1, adopted)
	require.Zero(t, testutil.ToFloat64(parkedGauge))
	v := h.orderView(orderID)
	require.Equal(t, "partially_refunded", v.Status)
	require.EqualValues(t, 2000, v.AmountRefunded)
	require.Equal(t, refunds.StatusSucceeded, v.Refunds[0].Status)
	require.Equal(t, h.stripeRefunds(pi)[0].ID, *v.Refunds[0].StripeRefundID)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.refunded'`, orderID))

	// Nothing resends it: the key is finished (its replay is the parked
	// 201), the completer has nothing to do, and a round finds nothing new.
	replay := h.refund(orderID, "parked", `{"amount":2000}`)
	requireReplay(t, final, replay)
	adopted, err = h.api.Refunds.ReconcileParked(context.Background(), 0, 100)
	require.NoError(t, err)
	require.Zero(t, adopted)
	require.Equal(t, 1, h.refundCreates(), "one create, under one key")
	require.Len(t, h.stripeRefunds(pi), 1, "one refund at Stripe")
}

// TestApplyStripeRefundMovesOnlyForward: the function the webhook handler
// calls, in its own transaction. An older state changes nothing, another
// account's refund is ErrNotOurs, and a refund Stripe fails after it had
// succeeded gives its amount back without moving the order's status back;
// a new refund can then take the whole amount again.
func TestApplyStripeRefundMovesOnlyForward(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, _ := h.paidOrder()
	rf := decodeRefund(t, h.refund(orderID, "a", `{"amount":1000}`))
	ctx := context.Background()

	changed, err := h.api.Refunds.ApplyStripeRefund(ctx, refunds.StripeRefund{ID: *rf.StripeRefundID, Status: "pending"})
	require.NoError(t, err)
	require.False(t, changed)
	_, err = h.api.Refunds.ApplyStripeRefund(ctx, refunds.StripeRefund{ID: "re_someone_else", Status: "succeeded"})
	require.ErrorIs(t, err, refunds.ErrNotOurs)
	// A second Stripe refund carrying our refund_id: not applied, counted,
	// and not an error a webhook would be retried for.
	_, err = h.api.Refunds.ApplyStripeRefund(ctx, refunds.StripeRefund{ID: "re_second", Status: "succeeded", Amount: 1000,
		Metadata: map[string]string{"refund_id": rf.ID}})
	require.ErrorIs(t, err, refunds.ErrDuplicateAtStripe)
	require.ErrorIs(t, err, refunds.ErrNotOurs)
	require.Equal(t, 1.0, testutil.ToFloat64(gathered{h.registry.Registry, "checkout_refund_duplicates_at_stripe_total", nil}))
	require.EqualValues(t, 1000, h.orderView(orderID).AmountRefunded)

	failed, err := h.emu.FailRefund(*rf.StripeRefundID, "")
	require.NoError(t, err)
	var st struct {
		Status        string `json:"status"`
		FailureReason string `json:"failure_reason"`
	}
	require.NoError(t, json.Unmarshal(failed, &st))
	changed, err = h.api.Refunds.ApplyStripeRefund(ctx, refunds.StripeRefund{ID: *rf.StripeRefundID, Status: st.Status, FailureReason: st.FailureReason})
	require.NoError(t, err)
	require.True(t, changed)
	v := h.orderView(orderID)
	require.Equal(t, "partially_refunded", v.Status, "no transition goes back")
	require.EqualValues(t, 0, v.AmountRefunded)
	require.Equal(t, refunds.StatusFailed, v.Refunds[0].Status)

	all := decodeRefund(t, h.refund(orderID, "b", `{}`))
	require.EqualValues(t, 5000, all.Amount)
	require.Equal(t, "refunded", h.orderView(orderID).Status)

	// The whole amount failed after it had succeeded: the order stays
	// refunded, and its amount can be refunded again, once.
	_, err = h.emu.FailRefund(*all.StripeRefundID, "")
	require.NoError(t, err)
	_, err = h.api.Refunds.ApplyStripeRefund(ctx, refunds.StripeRefund{ID: *all.StripeRefundID, Status: "failed"})
	require.NoError(t, err)
	v = h.orderView(orderID)
	require.Equal(t, "refunded", v.Status, "no transition goes back")
	require.EqualValues(t, 0, v.AmountRefunded)
	again := h.refund(orderID, "c", `{}`)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	require.EqualValues(t, 5000, decodeRefund(t, again).Amount)
	require.EqualValues(t, 5000, h.orderView(orderID).AmountRefunded)
	done := h.refund(orderID, "d", `{}`)
	require.Equal(t, http.StatusConflict, done.status, "%s", done.body)
	require.Equal(t, "order_not_refundable", decodeProblem(t, done).Code)
}

// TestUnansweredAttemptPastKeyRetentionIsReconciledNotResent: the process
// died after Stripe created the refund and before anything was recorded
// (the attempt has no outcome), and by the time a retry comes Stripe has
// pruned the key. Resending the key would refund a second time; the retry
// lists the PaymentIntent's refunds instead and adopts the one it finds.
func TestUnansweredAttemptPastKeyRetentionIsReconciledNotResent(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()
	first := decodeRefund(t, h.refund(orderID, "old", `{"amount":1000}`))

	// Back to the state of a crash right after the call, 25 hours ago:
	// past stripestep.ResendWindow (23h), as Stripe may prune a key after 24h.
	for _, q := range []string{
		`UPDATE refunds SET status = 'pending', stripe_refund_id = NULL, stripe_status = NULL, settled_at = NULL WHERE order_id = $1`,
		`UPDATE orders SET amount_refunded = 0, status = 'paid' WHERE id = $1`,
		`UPDATE payment_attempts SET outcome = NULL, stripe_object_id = NULL, stripe_status = NULL, created_at = now() - interval '25 hours' WHERE order_id = $1 AND step LIKE 'refund:%'`,
		`DELETE FROM outbox WHERE aggregate_id = $1 AND type = 'order.refunded'`,
	} {
		require.NoError(t, h.db.Exec(q, orderID).Error)
	}
	require.NoError(t, h.db.Exec(`UPDATE idempotency_keys SET recovery_point = 'refund_created', response_status = NULL, response_headers = NULL,
		response_body = NULL, finished_at = NULL, lease_owner = 'dead', lease_expires_at = now() - interval '1 second' WHERE key = 'old'`).Error)
	for _, k := range h.rdb.Keys(context.Background(), h.prefix+"*").Val() {
		require.NoError(t, h.rdb.Del(context.Background(), k).Err())
	}
	require.Positive(t, h.emu.PruneKeys())

	again := decodeRefund(t, h.refund(orderID, "old", `{"amount":1000}`))
	require.Equal(t, first.ID, again.ID)
	require.Equal(t, *first.StripeRefundID, *again.StripeRefundID, "adopted, not created again")
	require.Len(t, h.stripeRefunds(pi), 1)
	require.EqualValues(t, 1000, h.orderView(orderID).AmountRefunded)
}

// TestRefundWhileStripeIsDownResendsTheSameKey: Stripe answers 503 (stored
// by nobody) until the retries run out: 502, and the attempt stays open.
// Once Stripe is back the retry resends the same key at once (no
// reconciliation window to wait out): one attempt, one refund.
func TestRefundWhileStripeIsDownResendsTheSameKey(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.refundRetryAfter = time.Hour })
	orderID, pi := h.paidOrder()
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpRefundCreate, Status: 503}))

	down := h.refund(orderID, "down", `{"amount":900}`)
	require.Equal(t, http.StatusBadGateway, down.status, "%s", down.body)
	require.Equal(t, "payment_provider_unavailable", decodeProblem(t, down).Code)
	require.NotEmpty(t, down.header.Get("Retry-After"))
	h.emu.ClearFaults()

	rf := decodeRefund(t, h.refund(orderID, "down", `{"amount":900}`))
	require.Equal(t, refunds.StatusSucceeded, rf.Status)
	require.Len(t, h.stripeRefunds(pi), 1)
	var outcomes []string
	require.NoError(t, h.db.Raw(`SELECT outcome FROM payment_attempts WHERE step = ? ORDER BY attempt`, "refund:"+rf.ID).Scan(&outcomes).Error)
	require.Equal(t, []string{"succeeded"}, outcomes, "the same attempt, resent")
}

// TestRefundSettledByWebhook: Stripe keeps a refund pending, then fails it
// and later succeeds a second one; with no poller running, the refund
// webhooks alone settle both: the failed amount is refundable again, the
// order ends refunded with one order.refunded, and each event applies once.
func TestRefundSettledByWebhook(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.webhooks = true })
	orderID, pi := h.paidOrder()
	h.emu.SetRefundsPending(true)

	first := decodeRefund(t, h.refund(orderID, "wh-1", `{}`))
	require.Equal(t, refunds.StatusPending, first.Status)
	_, err := h.emu.FailRefund(*first.StripeRefundID, "")
	require.NoError(t, err)
	eventually(t, "refund.failed settles the refund", func() bool {
		v := h.orderView(orderID)
		return len(v.Refunds) == 1 && v.Refunds[0].Status == refunds.StatusFailed
	})
	require.Equal(t, "paid", h.orderView(orderID).Status, "a failed refund moves nothing backwards")

	second := decodeRefund(t, h.refund(orderID, "wh-2", `{}`))
	require.EqualValues(t, 5000, second.Amount, "the failed amount is refundable again")
	_, err = h.emu.SucceedRefund(*second.StripeRefundID)
	require.NoError(t, err)
	eventually(t, "the refund webhook settles the order", func() bool {
		return h.orderView(orderID).Status == "refunded"
	})
	v := h.orderView(orderID)
	require.EqualValues(t, 5000, v.AmountRefunded)
	require.Len(t, h.stripeRefunds(pi), 2)
	h.allWebhooksDelivered()
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.refunded'`, orderID))
	for _, typ := range []string{webhooks.TypeChargeRefunded, webhooks.TypeRefundUpdated, webhooks.TypeRefundFailed} {
		require.Zero(t, h.webhooks(typ, webhooks.OutcomeError), typ)
	}
}

// TestChargeRefundedSettlesARefundWhoseAnswerWasLost: a refund's create is
// answered with a stored 500 and Stripe rolls it forward a moment later,
// succeeded at once, so Stripe sends refund.created and charge.refunded
// but no refund.updated; refund.created comes late. charge.refunded in the API version since
// 2022-11-15 embeds no refunds: the handler lists the PaymentIntent's
// refunds at Stripe and settles ours from that, with no retry of the
// request, no poller and no completer running. One refund at Stripe.
func TestChargeRefundedSettlesARefundWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.webhooks = true; o.refundRetryAfter = time.Hour })
	orderID, pi := h.paidOrder()
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpRefundCreate, Count: 1,
		RollForward: stripeemu.RollForwardAfter(300 * time.Millisecond)}))
	first := h.refund(orderID, "lost-answer", `{"amount":700}`)
	require.Equal(t, http.StatusBadGateway, first.status, "%s", first.body)
	// refund.created, which would settle it by itself, comes late: the
	// next event is the roll-forward's (the create answered 502 at once).
	require.NoError(t, h.emu.InjectWebhookFault(stripeemu.HookFault{Kind: stripeemu.HookDelay, Count: 1, Delay: time.Minute}))

	eventually(t, "charge.refunded settles the refund", func() bool {
		v := h.orderView(orderID)
		return len(v.Refunds) == 1 && v.Refunds[0].Status == refunds.StatusSucceeded
	})
	require.EqualValues(t, 700, h.orderView(orderID).AmountRefunded)
	require.Equal(t, 1, h.webhooks(webhooks.TypeChargeRefunded, webhooks.OutcomeApplied))
	at := h.stripeRefunds(pi)
	require.Len(t, at, 1, "one refund at Stripe")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM refunds WHERE order_id = ? AND stripe_refund_id = ?`, orderID, at[0].ID))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.refunded'`, orderID))
}

// TestRefundStripeCredentialsRefused: Stripe refusing this service's own
// credentials (401, 403) while it refunds is not the refund being refused
// (CONTRACT.md v3): 503 payment_provider_unavailable with Retry-After 30,
// nothing stored under the key, the refund pending with its amount held;
// once the key works the same Idempotency-Key refunds, once. Before the
// fix: 502, "the payment provider did not answer", as for a timeout.
func TestRefundStripeCredentialsRefused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpRefundCreate, Status: status}))
		r := h.refund(orderID, "rotated-key", `{"amount":1000}`)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%d: %s", status, r.body)
		require.Equal(t, "payment_provider_unavailable", decodeProblem(t, r).Code)
		require.Equal(t, "30", r.header.Get("Retry-After"))
		h.emu.ClearFaults()
	}
	require.Zero(t, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'rotated-key' AND recovery_point = 'finished'`), "nothing stored")
	require.Empty(t, h.stripeRefunds(pi))
	held := h.refund(orderID, "other", `{"amount":4001}`)
	require.Equal(t, http.StatusConflict, held.status, "the pending refund's 1000 is held: %s", held.body)

	rf := decodeRefund(t, h.refund(orderID, "rotated-key", `{"amount":1000}`))
	require.Equal(t, int64(1000), rf.Amount)
	at := h.stripeRefunds(pi)
	require.Len(t, at, 1, "one refund at Stripe")
	require.Equal(t, rf.ID, at[0].RefundID)
}
