package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripestep"
)

// Tests of a first execution (internal/checkout/fastpath.go): a new key's
// checkout written as three statements, with the catalog's prices in
// memory.

// TestFirstExecutionChargesTheCurrentPrice: the api keeps the catalog's
// prices in memory for first executions, yet a price changed since it was
// read is never charged: the statement that writes the order checks the
// prices it was built with, writes nothing when one changed, and the
// checkout is made at the new price.
func TestFirstExecutionChargesTheCurrentPrice(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.checkout("price-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	old := decodeOrder(t, r).Items[0].UnitAmount

	require.NoError(t, h.db.Exec(`UPDATE products SET unit_amount = unit_amount + 600 WHERE sku = 'sku_tee'`).Error)
	for _, key := range []string{"price-2", "price-3"} { // the one that finds the change, then one from memory again
		r = h.checkout(key, teeBody)
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
		o := decodeOrder(t, r)
		require.Equal(t, old+600, o.Items[0].UnitAmount, key)
		require.Equal(t, int64(o.Items[0].Quantity)*(old+600), o.AmountTotal, key)
		var stored int64
		require.NoError(t, h.db.Raw(`SELECT amount_total FROM orders WHERE id = ?`, o.ID).Scan(&stored).Error)
		require.Equal(t, o.AmountTotal, stored, key)
		pis := h.requirePaymentInvariants(o.ID, string(orders.Paid))
		require.Len(t, pis, 1)
		require.Equal(t, o.AmountTotal, pis[0].Amount, "%s: Stripe charged the new price", key)
	}
}

// TestFirstExecutionAnswersWhatIsStored: a first execution renders its
// response and its events from what it wrote, without reading them back;
// they must be what the general path would have read: the order as GET
// /v1/orders/{id} shows it, and order.paid's data the same order.
func TestFirstExecutionAnswersWhatIsStored(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.checkout("stored-1", `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2},{"sku":"sku_mug","quantity":1},{"sku":"sku_tee","quantity":1}],"payment_method":"pm_card_visa"}`)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	g := h.get("sk_test_acme", "/v1/orders/"+o.ID)
	require.Equal(t, http.StatusOK, g.status, "%s", g.body)
	shown := decodeOrder(t, g)
	shown.CreatedAt = shown.CreatedAt.UTC()
	o.CreatedAt = o.CreatedAt.UTC()
	require.Equal(t, o, shown)

	var payloads []string
	require.NoError(t, h.db.Raw(`SELECT payload::text FROM outbox WHERE aggregate_id = ? ORDER BY aggregate_seq`, o.ID).Scan(&payloads).Error)
	require.Len(t, payloads, 2)
	require.Contains(t, payloads[1], `"type":"order.paid"`)
	require.Contains(t, payloads[1], `"data":`+string(r.body)+`,"aggregate_id":"`+o.ID+`","sequence":2}`,
		"order.paid carries the order as the response shows it")
}

// TestFirstExecutionFencedBeforeConfirm: the key is taken over (its lease
// lost) while the create is in flight. Phase 2 records the create's answer
// but writes no confirm attempt, and the run stops with 409: the confirm,
// the step that moves money, is never sent by a run that lost the key.
func TestFirstExecutionFencedBeforeConfirm(t *testing.T) {
	t.Parallel()
	s := &stealing{}
	h := setup(t, func(o *options) {
		o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider { s.PaymentProvider = p; return s }
	})
	s.steal = func() error {
		return h.db.Exec(`UPDATE idempotency_keys SET lease_owner = 'another-run' WHERE key = 'fenced-1'`).Error
	}
	r := h.checkout("fenced-1", teeBody)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, "idempotency_key_in_use", decodeProblem(t, r).Code)
	for _, rq := range h.emu.Requests() {
		require.NotEqual(t, stripeemu.OpPIConfirm, rq.Op, "a run that lost the key confirmed")
	}
	require.Zero(t, h.count(`SELECT count(*) FROM payment_attempts WHERE step = 'confirm'`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE step = 'create' AND outcome = 'succeeded'`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders WHERE status = 'pending_payment' AND payment_intent_id IS NOT NULL`))
}

// stealing is a Stripe client whose creates, once answered, run steal.
type stealing struct {
	checkout.PaymentProvider
	steal func() error
}

func (s *stealing) CreatePaymentIntent(ctx context.Context, req checkout.CreateIntentRequest) (checkout.PaymentIntentState, error) {
	pi, err := s.PaymentProvider.CreatePaymentIntent(ctx, req)
	if err == nil {
		if serr := s.steal(); serr != nil {
			return pi, serr
		}
	}
	return pi, err
}

// TestFirstExecutionSurvivesLosingPhaseTwo: phase 2 (the create's answer
// and the confirm attempt) commits without waiting for the WAL flush, so a
// crash of PostgreSQL can lose it, and all that followed it, after the
// confirm was sent. Here Stripe executes the confirm but its answer is
// lost (502), then the rows phase 2 and the confirm's answer wrote are
// taken away, as such a crash would. The client's retry resumes from phase
// 1's state and sends the same Stripe keys again: the create is answered
// with the same PaymentIntent, the confirm with its stored answer. One
// PaymentIntent, charged once, the order paid.
func TestFirstExecutionSurvivesLosingPhaseTwo(t *testing.T) {
	t.Parallel()
	s := &scripted{}
	s.confirm = func(n int, req checkout.ConfirmIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error) {
		pi, err := real.ConfirmPaymentIntent(context.Background(), req)
		if n == 1 && err == nil {
			return checkout.PaymentIntentState{}, fmt.Errorf("stripe confirm: %w: the answer was lost", stripestep.ErrUnanswered)
		}
		return pi, err
	}
	h := setup(t, func(o *options) {
		o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider { s.PaymentProvider = p; return s }
	})
	r := h.checkout("lost-phase-2", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	var orderID string
	require.NoError(t, h.db.Raw(`SELECT order_id FROM idempotency_keys WHERE key = 'lost-phase-2'`).Scan(&orderID).Error)

	// What a crash of PostgreSQL would leave: phase 1 alone.
	for _, q := range []string{
		`DELETE FROM payment_attempts WHERE order_id = ? AND step = 'confirm'`,
		`UPDATE payment_attempts SET outcome = NULL, stripe_object_id = NULL, stripe_status = NULL, error = NULL WHERE order_id = ?`,
		`UPDATE orders SET payment_intent_id = NULL, payment_status = NULL, payment_unknown_since = NULL WHERE id = ?`,
	} {
		require.NoError(t, h.db.Exec(q, orderID).Error)
	}

	r = h.checkout("lost-phase-2", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, orderID, decodeOrder(t, r).ID)
	pis := h.requirePaymentInvariants(orderID, string(orders.Paid))
	require.Len(t, pis, 1, "one PaymentIntent")
	keys := map[string][]string{}
	for _, rq := range h.emu.Requests() {
		if rq.Op == stripeemu.OpPICreate || rq.Op == stripeemu.OpPIConfirm {
			keys[rq.Op] = append(keys[rq.Op], rq.IdempotencyKey)
		}
	}
	require.Equal(t, []string{orderID + "/create/1", orderID + "/create/1"}, keys[stripeemu.OpPICreate], "the create sent again under its key")
	require.Equal(t, []string{orderID + "/confirm/1", orderID + "/confirm/1"}, keys[stripeemu.OpPIConfirm], "the confirm sent again under its key")
}

// TestFirstExecutionOfAnExistingKeyWritesNothing: a request whose key
// exists in PostgreSQL but not in Redis (the replay cache lost) tries a
// first execution, whose claim fails on the key's unique index: the whole
// statement is undone, the stock it reserved included, and the stored
// response is replayed. One order, one unit sold, one key, one charge.
func TestFirstExecutionOfAnExistingKeyWritesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	before := h.stock("sku_tee")
	first := h.checkout("existing-1", teeBody)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	o := decodeOrder(t, first)
	for range 3 {
		keys, err := h.rdb.Keys(context.Background(), h.prefix+"*").Result()
		require.NoError(t, err)
		if len(keys) > 0 {
			require.NoError(t, h.rdb.Del(context.Background(), keys...).Err())
		}
		again := h.checkout("existing-1", teeBody)
		require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, string(first.body), string(again.body))
	}
	require.Equal(t, before-int64(o.Items[0].Quantity), h.stock("sku_tee"), "the stock is taken once")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM order_items`))
	require.Equal(t, 2, h.count(`SELECT count(*) FROM outbox`), "order.created and order.paid, once each")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys`))
	require.Len(t, h.requirePaymentInvariants(o.ID, string(orders.Paid)), 1)
}

// TestFirstExecutionOutOfStock: the stock's guard fails phase 1's batch,
// which then wrote nothing (no claim, no order), and the general path
// finishes the key with its stored 409: every retry replays it, and no
// Stripe call is made.
func TestFirstExecutionOutOfStock(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.NoError(t, h.db.Exec(`UPDATE products SET stock = 0 WHERE sku = 'sku_tee'`).Error)
	for range 2 {
		r := h.checkout("sold-out-1", teeBody)
		require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
		require.Equal(t, "out_of_stock", decodeProblem(t, r).Code)
	}
	require.Zero(t, h.stock("sku_tee"))
	require.Zero(t, h.count(`SELECT count(*) FROM orders`))
	require.Zero(t, h.count(`SELECT count(*) FROM payment_attempts`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'sold-out-1' AND response_status = 409`))
	require.Empty(t, h.emu.Requests())
}

// TestFirstExecutionFencedBeforeSettling: the key is taken over while the
// confirm is in flight. Phase 3's batch fails at the key's fence and
// writes nothing of the order's change, yet the confirm's answer (a fact,
// whoever holds the key) is recorded on its own, and the run stops with
// 409. The order stays pending for the key's new owner, who finds the
// answer recorded.
func TestFirstExecutionFencedBeforeSettling(t *testing.T) {
	t.Parallel()
	s := &scripted{}
	var h *harness
	s.confirm = func(n int, req checkout.ConfirmIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error) {
		pi, err := real.ConfirmPaymentIntent(context.Background(), req)
		require.NoError(t, h.db.Exec(`UPDATE idempotency_keys SET lease_owner = 'another-run' WHERE key = 'fenced-3'`).Error)
		return pi, err
	}
	h = setup(t, func(o *options) {
		o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider { s.PaymentProvider = p; return s }
	})
	r := h.checkout("fenced-3", teeBody)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, "idempotency_key_in_use", decodeProblem(t, r).Code)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE step = 'confirm' AND outcome = 'succeeded'`),
		"the confirm's answer is recorded")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders WHERE status = 'pending_payment'`), "not paid by a run that lost the key")
	require.Zero(t, h.count(`SELECT count(*) FROM outbox WHERE type = 'order.paid'`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'fenced-3' AND response_status IS NULL`))
}

// TestFirstExecutionFindsAnotherIntentRecorded: phase 2 finds the order
// recording another PaymentIntent (which a run holding the key cannot
// meet; the general path copes). Its batch fails at the guard and writes
// nothing; the create's answer is recorded on its own, the run's
// PaymentIntent canceled as an orphan, and the checkout carries on with
// the recorded one: one PaymentIntent moves money, the order paid.
func TestFirstExecutionFindsAnotherIntentRecorded(t *testing.T) {
	t.Parallel()
	s := &scripted{}
	var h *harness
	s.create = func(n int, req checkout.CreateIntentRequest, real checkout.PaymentProvider) (checkout.PaymentIntentState, error) {
		pi, err := real.CreatePaymentIntent(context.Background(), req)
		if n == 1 && err == nil {
			// Another PaymentIntent of the order, recorded first.
			other := req
			other.IdempotencyKey = req.IdempotencyKey + "-other"
			o, oerr := real.CreatePaymentIntent(context.Background(), other)
			require.NoError(t, oerr)
			require.NoError(t, h.db.Exec(`UPDATE orders SET payment_intent_id = ?, payment_status = ? WHERE payment_intent_id IS NULL`, o.ID, o.Status).Error)
		}
		return pi, err
	}
	h = setup(t, func(o *options) {
		o.wrap = func(p checkout.PaymentProvider) checkout.PaymentProvider { s.PaymentProvider = p; return s }
	})
	r := h.checkout("other-intent-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	o := decodeOrder(t, r)
	pis := h.requirePaymentInvariants(o.ID, string(orders.Paid))
	require.Len(t, pis, 2, "the run's own, canceled, and the recorded one, paid")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM payment_attempts WHERE step = 'create' AND outcome = 'succeeded'`),
		"the create's answer is recorded")
}
