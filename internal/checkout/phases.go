package checkout

import (
	"context"
	"time"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripestep"
)

// The phases of a checkout, each written by one function here that
// queues the phase's writes through their owners (orders, stripestep,
// outbox, idempotency) into a postgres.Batch. The fast path (fastpath.go)
// sends each batch pipelined, in one round trip; the general path sends
// the same batch on its transaction or pipelined, where it needs to read
// first. Nothing else writes a phase.
//
//  1. Order created: queueOrderCreated.
//  2. PaymentIntent recorded: queueIntentRecorded.
//  3. Outcome settled: queueOutcome (also applyChange's, for the reconciler
//     and the webhook handler, which hold no key).
//
// In every phase the key comes before the order (idempotency.Fence, "Lock
// order"). The shape is river's insertManyShared, which serves its four
// insert APIs with one set of statements and leaves only the send to each.

// queueOrderCreated is phase 1, "order created": it queues in b the
// check that products are still the catalog's (guardCatalogChanged), the
// reservation of want's units (guardOutOfStock: nothing is taken when one
// is short), the order o with its items, and its order.created event. The
// key comes before it: claimed in the same batch on the fast path
// (Store.QueueClaimNew), or by the claim's transaction on the general path
// (Store.Claim), which then advances it.
func (s *Service) queueOrderCreated(ctx context.Context, b *postgres.Batch, o *orders.Order, want map[string]int64, products map[string]Product) error {
	queueReserve(b, want, products)
	orders.QueueInsert(b, o)
	return outbox.Queue(ctx, b, s.event(outbox.TypeOrderCreated, o, o.CreatedAt))
}

// queueReserve queues in b the check that products are still the
// catalog's (guardCatalogChanged) and the reservation of want's units
// (guardOutOfStock; reserve_stock takes nothing when one is short).
func queueReserve(b *postgres.Batch, want map[string]int64, products map[string]Product) {
	skus, qtys := sortedSKUs(want)
	prices, currencies := make([]int64, len(skus)), make([]string, len(skus))
	for i, sku := range skus {
		prices[i], currencies[i] = products[sku].UnitAmount, products[sku].Currency
	}
	b.QueueGuarded(guardCatalogChanged, `
		SELECT 1 FROM product_catalog c
		JOIN unnest(?::text[], ?::bigint[], ?::text[]) AS w (sku, unit_amount, currency)
		  ON c.sku = w.sku AND c.unit_amount = w.unit_amount AND c.currency = w.currency
		HAVING count(*) = ?`,
		[]any{postgres.TextArray(skus), postgres.IntArray(prices), postgres.TextArray(currencies), len(skus)}, nil)
	b.QueueGuarded(guardOutOfStock, `SELECT 1 WHERE reserve_stock(?::text[], ?::bigint[])`,
		[]any{postgres.TextArray(skus), postgres.IntArray(qtys)}, nil)
}

// queueIntentRecorded is phase 2, "PaymentIntent recorded": it queues in b
//
//  1. with confirm, the key's lease check (Fence.Queue): only the run that
//     holds the key writes the next call's attempt;
//  2. created's answer pi, when created is not nil (nil: it was recorded
//     before, or pi was found by a search);
//  3. pi recorded as the order's PaymentIntent: with confirm, only while
//     the order records no other (orders.GuardIntentTaken fails the
//     batch); without, unless one is recorded already (the first wins);
//  4. confirm, written before its call (stripestep.GuardTaken).
//
// Without confirm it writes only facts, which hold whoever holds the key,
// unfenced. It returns where the PaymentIntent recorded on the order is
// read once b is sent: pi's id, or the other one that won.
func (r *run) queueIntentRecorded(b *postgres.Batch, created *stripestep.Attempt, pi PaymentIntentState, confirm *stripestep.Attempt, now time.Time) *string {
	if confirm != nil {
		r.claim.Fence().Queue(b)
	}
	if created != nil {
		stripestep.QueueFinish(b, created, stripestep.Answer{Outcome: stripestep.Succeeded, ObjectID: pi.ID, Status: string(pi.Status)}, now)
	}
	recorded := new(string)
	if confirm == nil {
		orders.QueueRecordFirstIntent(b, r.o.ID, pi.ID, pi.Status, now, recorded)
		return recorded
	}
	orders.QueueRecordIntent(b, r.o.ID, pi.ID, pi.Status, now)
	stripestep.QueueInsert(b, confirm)
	b.AfterCommit(func() { *recorded = pi.ID })
	return recorded
}

// outcome is what phase 3 settles: the order's change (apply false: none;
// the key is finished with what the order's state calls for), and, when
// answered is not nil, the answer of the attempt whose call brought it,
// recorded with it (the fast path's confirm).
type outcome struct {
	change   orders.Change
	apply    bool
	answered *stripestep.Attempt
	answer   stripestep.Answer
}

// queueOutcome is phase 3, "outcome settled", the one function that
// writes it for both paths: it queues in b, for cur (the run's order as it
// is now: as the fast path wrote it, or locked and read after the key in
// the general path's transaction), in the lock order of idempotency.Fence:
//
//  1. out.answered's answer (stripestep.QueueFinish), when given: the
//     attempt's row, which neither the key's nor the order's holders lock;
//  2. the key: finished with the response the order's state after the
//     change calls for (Store.QueueFinish, which locks it), or only its
//     lease checked when that state is not final yet (Fence.Queue); no
//     key, nothing;
//  3. the order's change with its event (orders.QueueApply), when
//     out.apply and cur may still move to it, and the stock given back
//     when it leaves the way to paid.
//
// It returns the order as it is once b commits, and the key's response
// (nil when not final, or without a key). Pipelined (postgres.Send on the
// pool) a moved order or a lost lease fail b at a guard and write nothing;
// on the general path's transaction they cannot, as it holds both locks.
func (r *run) queueOutcome(ctx context.Context, b *postgres.Batch, cur *orders.Order, out outcome, now time.Time) (*orders.Order, *idempotency.Response, error) {
	next := cur
	moves := out.apply && cur.Status.CanMoveTo(out.change.To)
	if moves {
		next = cur.Changed(out.change, now)
	}
	if out.answered != nil {
		stripestep.QueueFinish(b, out.answered, out.answer, now)
	}
	var resp *idempotency.Response
	if r.claim != nil {
		if resp = responseFor(r.route, next); resp != nil {
			if err := r.s.Keys.QueueFinish(b, r.claim, resp); err != nil {
				return nil, nil, err
			}
		} else {
			r.claim.Fence().Queue(b)
		}
	}
	if !moves {
		return next, resp, nil
	}
	ch := out.change
	if _, err := orders.QueueApply(ctx, b, cur, ch, now); err != nil {
		return nil, nil, err
	}
	if ch.To.LeavesTheWayToPaid() {
		queueRelease(b, cur)
	}
	b.AfterCommit(func() {
		if ch.To == orders.PaymentUnknown {
			r.s.Metrics.unknown()
		}
		r.s.Logger.InfoContext(ctx, "order status changed", "order_id", cur.ID, "to", ch.To, "payment_intent", next.Payment.PaymentIntentID)
	})
	return next, resp, nil
}
