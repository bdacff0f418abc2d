package checkout

import (
	"context"
	"errors"
	"fmt"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/stripestep"
)

// A first execution is what almost every checkout is: a key never seen, a
// valid body, products in stock, a card Stripe charges. It needs no
// transaction of several round trips, and no reading back of what it
// wrote, because nothing but it can have touched its rows: it sends each
// phase's batch (phases.go: the same functions the general path sends;
// postgres.Batch: the statements of each table's owner, in one round trip,
// committed together or not at all) pipelined, and writes each Stripe
// call's answer together with the next call's attempt:
//
//  1. the claim, then queueOrderCreated (the stock, the order, its items,
//     order.created), then the create attempt (recovery point
//     order_created);
//  2. queueIntentRecorded with the confirm: the create's answer, the
//     PaymentIntent on the order, the confirm attempt;
//  3. queueOutcome with the confirm's answer: the key finished with the
//     response, the order paid, order.paid.
//
// That is three commits and four round trips (the catalog is read first),
// where the general path takes a transaction of several round trips for
// the first phase alone. The guarantees are the general path's: each batch
// is one phase, every attempt is written before its call, every write
// after the claim is fenced by the key's lease (idempotency.Fence, first in
// the batch, or the key's own fenced finish). Anything else (the key
// exists, the body or the catalog says no, the stock is short, Stripe declines, is indeterminate or unanswered,
// another run got there first) fails the batch at a guard, which writes
// nothing of it, and leaves the first execution for the general path at
// that point, which reads the persisted state and carries on from it.

// firstOrder is phase 1 of a first execution, done.
type firstOrder struct {
	claim  *idempotency.Claim
	order  *orders.Order
	create *stripestep.Attempt
}

// Guards of the checkout's own batch statements (postgres.IsGuard).
const (
	// guardCatalogChanged: a product's price or currency is no longer what
	// the order was built with.
	guardCatalogChanged = "checkout_catalog_changed"
	// guardOutOfStock: a product has fewer units than the order wants.
	guardOutOfStock = "checkout_out_of_stock"
)

// beginFastPath runs phase 1 of cmd as a first execution. It returns nil, and
// has written nothing, when cmd is not one: the body has errors, a sku is
// unknown, the currencies differ (the general path reports those after the
// stored-key rules, as the contract orders them), the catalog changed, the
// stock is short (the general path stores the 409), or the key exists.
func (s *Service) beginFastPath(ctx context.Context, cmd CheckoutCommand) (*firstOrder, error) {
	in := cmd.Input
	if in == nil || len(cmd.InputErrors) > 0 || len(in.validate(nil)) > 0 {
		return nil, nil
	}
	want, skus := in.wanted()
	// Usually from memory; the batch checks that the prices are current.
	products, err := s.catalog.lookup(ctx, s.DB, skus)
	if err != nil {
		return nil, err
	}
	if len(in.unknownSKUs(products)) > 0 || len(in.mixedCurrencies(products)) > 0 {
		return nil, nil
	}
	o := s.newOrder(cmd.Tenant, in, products)
	r := s.newRun(nil, Route, o)
	create := r.newAttempt(stripestep.StepCreate, 1, "", r.createRequest(1))
	scope := idempotency.Scope{Tenant: cmd.Tenant, Route: Route, Key: cmd.IdempotencyKey}

	var b postgres.Batch
	claim := s.Keys.QueueClaimNew(&b, scope, cmd.Fingerprint, cmd.Owner, RecoveryPointOrderCreated, o.ID)
	if err := s.queueOrderCreated(ctx, &b, o, want, products); err != nil {
		return nil, err
	}
	stripestep.QueueInsert(&b, create)
	err = postgres.Send(ctx, s.DB, &b)
	switch {
	case idempotency.IsKeyTaken(err), postgres.IsGuard(err, guardOutOfStock):
		return nil, nil
	case postgres.IsGuard(err, guardCatalogChanged):
		s.catalog.forget(skus)
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("claim key and insert order: %w", err)
	}
	return &firstOrder{claim: claim, order: o, create: create}, nil
}

// payFastPath is pay for the run of a first execution, whose create attempt
// phase 1 wrote: phases 2 and 3 while Stripe answers as it does for a
// chargeable card, the general path from the first other answer on.
func (r *run) payFastPath(ctx context.Context, create *stripestep.Attempt) (*idempotency.Response, error) {
	r.created = 1
	pi, err := r.s.Payments.CreatePaymentIntent(ctx, r.createRequest(create.Attempt))
	if err != nil || pi.Status != stripeintent.RequiresConfirmation {
		res := r.recordAnswer(ctx, create, pi, err)
		switch {
		case res.err != nil:
			return r.stop(ctx, res.err)
		case res.refusal != nil:
			return r.settle(ctx, &verdict{refusal: res.refusal})
		}
		return r.pay(ctx) // indeterminate, or an unexpected state: reconcile
	}

	// Phase 2.
	confirm := r.newAttempt(stripestep.StepConfirm, 1, pi.ID, ConfirmIntentRequest{PaymentIntentID: pi.ID, ReturnURL: r.o.ReturnURL})
	if err := r.recordCreated(ctx, create, pi, confirm); err != nil {
		if errors.Is(err, errOtherIntent) {
			// Another run recorded another PaymentIntent first (it cannot
			// have without the lease; the general path copes): this one is
			// an orphan, canceled by record.
			return r.pay(ctx)
		}
		return r.stop(ctx, err)
	}
	r.o.Payment.PaymentIntentID, r.o.Payment.Status = pi.ID, pi.Status
	r.confirmed = 1

	got, err := r.s.Payments.ConfirmPaymentIntent(ctx, ConfirmIntentRequest{
		IdempotencyKey: confirm.IdempotencyKey, PaymentIntentID: pi.ID, ReturnURL: r.o.ReturnURL})
	if err == nil && got.Status == stripeintent.Succeeded {
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
	v, err := r.confirmVerdict(ctx, pi.ID, confirm, got, err)
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

// errOtherIntent is recordCreated's error when the order records another
// PaymentIntent than the create's.
var errOtherIntent = errors.New("the order records another payment intent")

// recordCreated is phase 2 on the fast path: queueIntentRecorded's batch
// with the confirm (the create attempt's answer pi, pi recorded on the
// order, confirm written before its call, all while the run holds the
// key), sent pipelined. When the batch fails at a guard it writes the
// phase's facts alone (record: the answer and the PaymentIntent, first
// wins), and returns errOtherIntent when the order records another
// PaymentIntent, stripestep.ErrTaken when the key or the confirm is
// another run's.
//
// It commits without waiting for the WAL flush (CommitWithoutFlush),
// which halves its cost: losing it can only mean losing phase 2 and
// everything after it in the WAL, in a crash of PostgreSQL itself (never
// of this process) before phase 3 commits, which waits for the flush of
// all of it. What is left then is phase 1's state, and the saga's
// resumption sends the same Stripe keys again, derived from (order, step,
// attempt): the create is answered with the same PaymentIntent, the
// confirm under the same key with its stored answer, so nothing is charged
// twice. Phase 1 and phase 3 wait for the flush: the first holds the order
// whose id names the Stripe keys, the last the response.
func (r *run) recordCreated(ctx context.Context, create *stripestep.Attempt, pi PaymentIntentState, confirm *stripestep.Attempt) error {
	var b postgres.Batch
	b.CommitWithoutFlush()
	r.queueIntentRecorded(&b, create, pi, confirm, r.now())
	err := postgres.Send(ctx, r.s.DB, &b)
	if !postgres.IsGuard(err, "") {
		if err != nil {
			return fmt.Errorf("record payment intent of %s: %w", create.OrderID, err)
		}
		return nil
	}
	got, _, err := r.record(ctx, create, pi)
	switch {
	case err != nil:
		return err
	case got.ID != pi.ID:
		return errOtherIntent
	}
	return stripestep.ErrTaken // the lease is gone, or the confirm is written
}

// settlePaid is phase 3 on the fast path: while the run holds the key and
// the order may still move to paid, queueOutcome's batch (the key finished
// with the 201, the confirm's answer got, the order paid with order.paid)
// sent pipelined. It returns nil, nil when the batch failed at a guard (the
// lease is gone, or the order moved): then it has recorded the answer
// alone, and the caller settles the general way.
func (r *run) settlePaid(ctx context.Context, confirm *stripestep.Attempt, got PaymentIntentState) (*idempotency.Response, error) {
	ch, _ := r.changeForState(got, "")
	now := r.now()
	answer := stripestep.Answer{Outcome: stripestep.Succeeded, ObjectID: got.ID, Status: string(got.Status)}
	var b postgres.Batch
	paid, resp, err := r.queueOutcome(ctx, &b, r.o, outcome{change: ch, apply: true, answered: confirm, answer: answer}, now)
	if err != nil {
		return nil, err
	}
	err = postgres.Send(ctx, r.s.DB, &b)
	if postgres.IsGuard(err, "") {
		return nil, stripestep.Finish(ctx, r.s.DB, confirm, answer, now)
	}
	if err != nil {
		return nil, fmt.Errorf("settle order %s: %w", confirm.OrderID, err)
	}
	r.o = paid
	return resp, nil
}
