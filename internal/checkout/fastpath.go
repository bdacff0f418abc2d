package checkout

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripestep"
)

// A first execution is what almost every checkout is: a key never seen, a
// valid body, a card Stripe charges. It needs no transaction of several
// statements, and no reading back of what it wrote, because nothing but it
// can have touched its rows: it writes each phase as one statement of
// data-modifying CTEs, which PostgreSQL runs and commits atomically, and
// writes each Stripe call's answer together with the next call's attempt:
//
//  1. the claim, the stock, the order, its items, order.created and the
//     create attempt (recovery point order_created; out of stock: the key
//     finished with its stored 409 instead);
//  2. the create's answer, the PaymentIntent on the order, the confirm
//     attempt;
//  3. the confirm's answer, the order paid, order.paid, the key finished
//     with the response.
//
// That is three commits and four round trips (the catalog is read first),
// where the general path takes a transaction of five round trips for the
// first phase alone. The guarantees are the general path's: each
// statement is one phase, every attempt is written before its call, every
// write after the claim is fenced by the key's lease. Anything else (the
// key exists, the body or the catalog says no, Stripe declines, is
// indeterminate or unanswered, another run got there first) leaves the
// first execution for the general path at that point, which reads the
// persisted state and carries on from it.

// firstOrder is phase 1 of a first execution, done.
type firstOrder struct {
	claim  *idempotency.Claim
	order  *Order // nil when final is set
	create *stripestep.Attempt
	// final is the stored response the phase finished the key with (out of
	// stock).
	final *idempotency.Response
}

// beginFirst runs phase 1 of cmd as a first execution. It returns nil, and
// has written nothing, when cmd is not one: the body has errors, a sku is
// unknown, the currencies differ (the general path reports those after the
// stored-key rules, as the contract orders them), or the key exists.
func (s *Service) beginFirst(ctx context.Context, cmd CheckoutCommand) (*firstOrder, error) {
	in := cmd.Input
	if in == nil || len(cmd.InputErrors) > 0 || len(in.validate(nil)) > 0 {
		return nil, nil
	}
	want, skus := in.wanted()
	// Usually from memory; the statement checks that the prices are current.
	products, err := s.catalog.lookup(ctx, s.DB, skus)
	if err != nil {
		return nil, err
	}
	if len(in.unknownSKUs(products)) > 0 || len(in.mixedCurrencies(products)) > 0 {
		return nil, nil
	}
	o := s.newOrder(cmd.Tenant, in, products)
	r := s.newRun(nil, Route, o)
	create := r.newAttempt(StepCreate, 1, "", r.createRequest(1))

	scope := idempotency.Scope{Tenant: cmd.Tenant, Route: Route, Key: cmd.IdempotencyKey}
	outOfStock := responseForError(ErrOutOfStock)
	claim, claimArgs, err := s.Keys.ClaimNewStatement(scope, cmd.Fingerprint, cmd.Owner,
		RecoveryPointOrderCreated, o.ID, outOfStock, "r", "r.ok")
	if err != nil {
		return nil, err
	}
	event, eventArgs, err := outbox.Statement(s.event(outbox.TypeOrderCreated, o, o.CreatedAt))
	if err != nil {
		return nil, err
	}
	reserved, keyID, expiresAt, err := createFirstOrder(ctx, s.DB, o, want, products, claim, claimArgs, event, eventArgs, create)
	switch {
	case idempotency.IsKeyTaken(err):
		return nil, nil
	case errors.Is(err, errCatalogChanged):
		s.catalog.forget(skus)
		return nil, nil
	case err != nil:
		return nil, err
	case !reserved:
		return &firstOrder{final: outOfStock,
			claim: idempotency.ClaimedNew(keyID, scope, cmd.Fingerprint, cmd.Owner, "", "", outOfStock, expiresAt)}, nil
	}
	c := idempotency.ClaimedNew(keyID, scope, cmd.Fingerprint, cmd.Owner, RecoveryPointOrderCreated, o.ID, nil, expiresAt)
	return &firstOrder{claim: c, order: o, create: create}, nil
}

// payFirst is pay for the run of a first execution, whose create attempt
// phase 1 wrote: phases 2 and 3 while Stripe answers as it does for a
// chargeable card, the general path from the first other answer on.
func (r *run) payFirst(ctx context.Context, create *stripestep.Attempt) (*idempotency.Response, error) {
	r.created = 1
	pi, err := r.s.Payments.CreatePaymentIntent(ctx, r.createRequest(create.Attempt))
	if err != nil || pi.Status != PIRequiresConfirmation {
		res := r.answer(ctx, create, pi, err)
		switch {
		case res.err != nil:
			return r.stop(ctx, res.err)
		case res.refusal != nil:
			return r.settle(ctx, &verdict{refusal: res.refusal})
		}
		return r.pay(ctx) // indeterminate, or an unexpected state: reconcile
	}

	// Phase 2.
	confirm := r.newAttempt(StepConfirm, 1, pi.ID, ConfirmIntentRequest{PaymentIntentID: pi.ID, ReturnURL: r.o.ReturnURL})
	recorded, err := recordCreated(ctx, r.s.DB, create, pi, confirm, r.fence(), r.now())
	if err != nil {
		return r.stop(ctx, err)
	}
	r.o.Payment.PaymentIntentID = recorded
	if recorded != pi.ID {
		// Another run recorded another PaymentIntent first (it cannot have
		// without the lease; the general path copes): this one is an orphan.
		r.cancelOrphans(ctx, []PaymentIntentState{pi}, recorded)
		return r.pay(ctx)
	}
	r.o.Payment.Status = pi.Status
	if confirm.ID == 0 {
		return r.stop(ctx, stripestep.ErrTaken) // the lease is gone
	}
	r.confirmed = 1

	got, err := r.s.Payments.ConfirmPaymentIntent(ctx, ConfirmIntentRequest{
		IdempotencyKey: confirm.IdempotencyKey, PaymentIntentID: pi.ID, ReturnURL: r.o.ReturnURL})
	if err == nil && got.Status == PISucceeded {
		// Phase 3.
		if resp, err := r.settlePaid(ctx, confirm, got); resp != nil || err != nil {
			if err != nil {
				return r.stop(ctx, err)
			}
			return resp, nil
		}
		// The order moved meanwhile or the lease is gone: the general
		// settlement sorts out which (the answer is recorded).
		return r.settle(ctx, &verdict{pi: &got})
	}
	v, err := r.confirmAnswered(ctx, pi.ID, confirm, got, err)
	if err != nil {
		return r.stop(ctx, err)
	}
	if v == nil { // indeterminate: reconcile it
		if v, err = r.confirm(ctx, pi); err != nil {
			return r.stop(ctx, err)
		}
	}
	return r.settle(ctx, v)
}

// settlePaid is phase 3: it records the confirm's answer got (succeeded)
// and, in the same statement, while the run holds the key and the order is
// still pending, makes the order paid, adds order.paid and finishes the key
// with the 201. It returns nil, nil when the answer is recorded but the rest
// could not be applied (the key's lease is gone, or the order moved): the
// caller settles the general way.
func (r *run) settlePaid(ctx context.Context, confirm *stripestep.Attempt, got PaymentIntentState) (*idempotency.Response, error) {
	ch, _ := r.changeFor(got, false)
	now := r.now()
	// What the order is once paid: what the general path would read back.
	paid := *r.o
	paid.Status, paid.Payment.PaymentIntentID, paid.Payment.Status = ch.To, got.ID, got.Status
	paid.Payment.NextAction, paid.Payment.ClientSecret = nil, ""
	paid.FailureCode, paid.DeclineCode, paid.UnknownSince = "", "", nil
	resp := responseFor(r.route, &paid)

	transition, transitionArgs, err := orders.Statement(r.o.ID, ch, now)
	if err != nil {
		return nil, err
	}
	event, eventArgs, err := outbox.Statement(r.s.event(outbox.TypeOrderPaid, &paid, now))
	if err != nil {
		return nil, err
	}
	finish, finishArgs, err := r.s.Keys.FinishStatement(r.claim, resp)
	if err != nil {
		return nil, err
	}
	expiresAt, ok, err := settleFirstPaid(ctx, r.s.DB, confirm, got, now, r.claim.Fence(),
		transition, transitionArgs, event, eventArgs, finish, finishArgs)
	if err != nil || !ok {
		return nil, err
	}
	r.o = &paid
	r.claim.Finished(resp, expiresAt)
	r.s.Logger.InfoContext(ctx, "order status changed", "order_id", paid.ID, "to", paid.Status, "payment_intent", got.ID)
	return resp, nil
}

// errCatalogChanged is returned by createFirstOrder when a product's price
// or currency is no longer what the order was built with.
var errCatalogChanged = errors.New("catalog changed since it was read")

// createFirstOrder is phase 1's statement: unless a product's price or
// currency is no longer the one in products (errCatalogChanged, and nothing
// is written), it reserves want's units; claims
// the key with claim (ClaimNewStatement over r), at order_created if the
// stock was reserved and finished with out of stock if not; and, only if
// reserved, inserts the order, its items, the event and the create attempt
// (whose ID it sets). A key that exists fails the whole statement
// (idempotency.IsKeyTaken), which then changed nothing, the reservation
// included.
func createFirstOrder(ctx context.Context, db *gorm.DB, o *Order, want map[string]int64, products map[string]Product,
	claim string, claimArgs []any, event string, eventArgs []any, create *stripestep.Attempt) (reserved bool, keyID int64, expiresAt time.Time, err error) {
	skus, qtys := sortedSKUs(want)
	prices, currencies := make([]int64, len(skus)), make([]string, len(skus))
	for i, sku := range skus {
		prices[i], currencies[i] = products[sku].UnitAmount, products[sku].Currency
	}
	args := []any{len(skus), postgres.TextArray(skus), postgres.IntArray(prices), postgres.TextArray(currencies),
		postgres.TextArray(skus), postgres.IntArray(qtys)}
	args = append(args, claimArgs...)
	args = append(args, orders.InsertArgs(o)...)
	insertCreate, createArgs := stripestep.InsertStatement(create, stripestep.Fence{Cond: `EXISTS (SELECT 1 FROM o)`})
	args = append(append(args, eventArgs...), createArgs...)
	var attemptID sql.NullInt64
	err = db.WithContext(ctx).Raw(`
		WITH p AS MATERIALIZED (
			SELECT count(*) = ? AS current FROM product_catalog c
			JOIN unnest(?::text[], ?::bigint[], ?::text[]) AS w (sku, unit_amount, currency)
			  ON c.sku = w.sku AND c.unit_amount = w.unit_amount AND c.currency = w.currency),
		r AS MATERIALIZED (SELECT reserve_stock(?::text[], ?::bigint[]) AS ok FROM p WHERE p.current),
		k AS (`+claim+` RETURNING id, expires_at),
		o AS (`+orders.InsertSQL+` FROM r WHERE r.ok RETURNING id),
		i AS (`+orders.InsertItemsSQL+`),
		e AS (`+event+` WHERE EXISTS (SELECT 1 FROM o)),
		a AS (`+insertCreate+` RETURNING id)
		SELECT r.ok AS reserved, k.id AS key_id, k.expires_at, (SELECT id FROM a) AS create_id FROM r, k`, args...).Row().Scan(&reserved, &keyID, &expiresAt, &attemptID)
	if errors.Is(err, sql.ErrNoRows) {
		return false, 0, time.Time{}, errCatalogChanged // r is empty: nothing was written
	}
	if err != nil {
		return false, 0, time.Time{}, fmt.Errorf("claim key and insert order: %w", err)
	}
	create.ID = attemptID.Int64
	return reserved, keyID, expiresAt, nil
}

// recordCreated is phase 2's statement: the create attempt's answer pi, pi
// recorded on the order unless another PaymentIntent is (orders.RecordIntent), and
// confirm written before its call, fenced by the key's lease and only if pi
// is the order's. It returns the order's PaymentIntent and sets confirm.ID
// (0 when confirm was not written).
//
// It commits without waiting for the WAL flush (synchronous_commit off for
// this transaction alone), which halves its cost: losing it can only mean
// losing phase 2 and everything after it in the WAL, in a crash of
// PostgreSQL itself (never of this process) before phase 3 commits, which
// waits for the flush of all of it. What is left then is phase 1's state, and
// the saga's resumption sends the same Stripe keys again, derived from
// (order, step, attempt): the create is answered with the same
// PaymentIntent, the confirm under the same key with its stored answer, so
// nothing is charged twice. Phase 1 and phase 3 wait for the flush: the first
// holds the order whose id names the Stripe keys, the last the response.
func recordCreated(ctx context.Context, db *gorm.DB, create *stripestep.Attempt, pi PaymentIntentState, confirm *stripestep.Attempt,
	fence stripestep.Fence, now time.Time) (string, error) {
	finishCreate, args := stripestep.FinishStatement(create.ID, stripestep.Answer{Outcome: stripestep.Succeeded, ObjectID: pi.ID, Status: pi.Status}, now)
	args = append(args, orders.RecordIntentArgs(create.OrderID, pi.ID, pi.Status, now)...)
	// The confirm only for pi recorded on the order, and under the run's
	// fence (if any).
	fence.Cond, fence.Args = joinCond(fence.Cond, `EXISTS (SELECT 1 FROM o WHERE o.payment_intent_id = ?)`), append(fence.Args[:len(fence.Args):len(fence.Args)], pi.ID)
	insertConfirm, confirmArgs := stripestep.InsertStatement(confirm, fence)
	args = append(args, confirmArgs...)
	var recorded string
	var confirmID sql.NullInt64
	err := db.WithContext(ctx).Raw(`
		WITH sc AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)),
		a AS (`+finishCreate+`),
		o AS (`+orders.RecordIntentSQL+` RETURNING payment_intent_id),
		c AS (`+insertConfirm+` RETURNING id)
		SELECT (SELECT payment_intent_id FROM o) AS recorded, (SELECT id FROM c) AS confirm_id FROM sc`, args...).Row().Scan(&recorded, &confirmID)
	if err != nil {
		return "", fmt.Errorf("record payment intent of %s: %w", create.OrderID, err)
	}
	confirm.ID = confirmID.Int64
	return recorded, nil
}

// settleFirstPaid is phase 3's statement (see settlePaid): the confirm
// attempt's answer always; the order's transition, the event and the key's
// finish only together, while fence holds (the key locked first, so that
// no takeover slips between the checks) and the order may move. It returns
// the key's expires_at and whether they were applied.
func settleFirstPaid(ctx context.Context, db *gorm.DB, confirm *stripestep.Attempt, got PaymentIntentState, now time.Time, fence idempotency.Fence,
	transition string, transitionArgs []any, event string, eventArgs []any, finish string, finishArgs []any) (time.Time, bool, error) {
	lock, lockArgs := fence.Lock()
	finishConfirm, args := stripestep.FinishStatement(confirm.ID, stripestep.Answer{Outcome: stripestep.Succeeded, ObjectID: got.ID, Status: got.Status}, now)
	args = append(args, lockArgs...)
	args = append(append(append(args, transitionArgs...), eventArgs...), finishArgs...)
	var expiresAt sql.NullTime
	err := db.WithContext(ctx).Raw(`
		WITH a AS (`+finishConfirm+`),
		f AS MATERIALIZED (`+lock+`),
		o AS (`+transition+` AND EXISTS (SELECT 1 FROM f) RETURNING id),
		e AS (`+event+` WHERE EXISTS (SELECT 1 FROM o)),
		k AS (`+finish+` AND EXISTS (SELECT 1 FROM o) RETURNING expires_at)
		SELECT (SELECT expires_at FROM k) AS finished_until`, args...).Row().Scan(&expiresAt)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("settle order %s: %w", confirm.OrderID, err)
	}
	return expiresAt.Time, expiresAt.Valid, nil
}

// joinCond returns the SQL conditions a and b joined by AND ("" is true).
func joinCond(a, b string) string {
	if a == "" {
		return b
	}
	return a + ` AND ` + b
}
