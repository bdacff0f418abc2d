package sweep

import (
	"context"
	"fmt"
	"time"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripestep"
)

// The reconciler's candidates, chosen through the Go APIs of the tables'
// owners (idempotency, orders, stripestep): each answers for its own table,
// and the choice is made here, in Go.

// unknownPayments lists up to BatchSize keys to resume through Complete:
// unfinished keys whose lease expired more than Grace before now and whose
// order is still on the way to paid (Pending) with a payment in doubt
// (payment_unknown, or its latest PaymentIntent attempt Indeterminate),
// the longest expired first. It pages through the expired keys until it
// has BatchSize or has seen them all, so keys it passes over (the
// completer's: a process died mid-step) never hide the ones behind them.
// Those are few: the completer finishes them within a round or two.
func (r *Reconciler) unknownPayments(ctx context.Context, now time.Time) ([]int64, error) {
	var keys []int64
	var after idempotency.ExpiredKey
	for len(keys) < r.cfg.BatchSize {
		page, err := idempotency.ExpiredOrders(ctx, r.db, now.Add(-r.cfg.Grace), after, r.cfg.BatchSize)
		if err != nil {
			return nil, err
		}
		if len(page) == 0 {
			break
		}
		ids := make([]string, len(page))
		for i, k := range page {
			ids[i] = k.OrderID
		}
		statuses, err := orders.Statuses(ctx, r.db, ids)
		if err != nil {
			return nil, err
		}
		var pending []string
		for _, id := range ids {
			if s := statuses[id]; s.Pending() && s != orders.PaymentUnknown {
				pending = append(pending, id)
			}
		}
		outcomes, err := stripestep.LatestPaymentOutcomes(ctx, r.db, pending)
		if err != nil {
			return nil, err
		}
		for _, k := range page {
			s := statuses[k.OrderID]
			if s == orders.PaymentUnknown || (s.Pending() && outcomes[k.OrderID] == stripestep.Indeterminate) {
				keys = append(keys, k.ID)
				if len(keys) == r.cfg.BatchSize {
					break
				}
			}
		}
		if len(page) < r.cfg.BatchSize {
			break
		}
		after = page[len(page)-1]
	}
	return keys, nil
}

// orphanSweeps lists up to BatchSize orders to search for orphan
// PaymentIntents: those with a create attempt after the first made in the
// last SweepFor (stripestep.Recreated: only they can have an orphan), no
// longer being paid, and not swept in the last SweepEvery, the longest
// unswept first. It reads no order that has no second create, however
// many there are.
func (r *Reconciler) orphanSweeps(ctx context.Context, now time.Time) ([]orders.Ref, error) {
	ids, err := stripestep.Recreated(ctx, r.db, now.Add(-r.cfg.SweepFor))
	if err != nil {
		return nil, fmt.Errorf("orphan sweep: %w", err)
	}
	return orders.OrphanSweepsDue(ctx, r.db, ids, now.Add(-r.cfg.SweepEvery), r.cfg.BatchSize)
}
