package stripestep

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
)

// What the reconciler (internal/sweep) asks of the step log to choose its
// orders; it combines the answers with those of idempotency and orders.

// recreatedSQL spells the predicate of the partial index
// payment_attempts_recreated (migration 00007) literally, without
// parameters, so that the planner can use the index.
const recreatedSQL = `SELECT DISTINCT order_id FROM payment_attempts
	WHERE step = '` + StepCreate + `' AND attempt > 1 AND created_at > ?`

// Recreated returns the ids of the orders with a create attempt after the
// first written after since, in no order. Only such an order can have an
// orphan PaymentIntent: Stripe creates at most one object per idempotency
// key (https://docs.stripe.com/api/idempotent_requests), and a create goes
// out under a new key only after the one before was answered
// indeterminately or not at all. It reads the partial index
// payment_attempts_recreated, which holds only those attempts, so its cost
// follows them, not the shop's history.
func Recreated(ctx context.Context, db *gorm.DB, since time.Time) ([]string, error) {
	var ids []string
	if err := db.WithContext(ctx).Raw(recreatedSQL, since).Scan(&ids).Error; err != nil {
		return nil, fmt.Errorf("list orders with a second create: %w", err)
	}
	return ids, nil
}

// LatestPaymentOutcomes returns, by order id, the outcome of the latest
// attempt (by when it was last written or answered) of the PaymentIntent
// steps (create, confirm) of each of the orders orderIDs that has one. An
// order whose latest is Indeterminate must be reconciled with Stripe before
// anything is sent again.
func LatestPaymentOutcomes(ctx context.Context, db *gorm.DB, orderIDs []string) (map[string]Outcome, error) {
	m := make(map[string]Outcome, len(orderIDs))
	if len(orderIDs) == 0 {
		return m, nil
	}
	var rows []struct {
		OrderID string
		Outcome Outcome
	}
	err := db.WithContext(ctx).Raw(`
		SELECT DISTINCT ON (order_id) order_id, outcome FROM payment_attempts
		WHERE order_id = ANY(?::text[]) AND step IN ?
		ORDER BY order_id, updated_at DESC, id DESC`,
		postgres.TextArray(orderIDs), []string{StepCreate, StepConfirm}).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("read the latest payment attempts of %d orders: %w", len(orderIDs), err)
	}
	for _, r := range rows {
		m[r.OrderID] = r.Outcome
	}
	return m, nil
}

// straySQL spells the predicate of the partial index
// payment_attempts_stray_refunds (migration 00019) literally, so that the
// planner reads only that index.
const straySQL = `SELECT DISTINCT ON (order_id, step) * FROM payment_attempts
	WHERE step LIKE '` + strayRefundPrefix + `%'
	ORDER BY order_id, step, attempt DESC`

// StrayRefunds returns the latest attempt of every stray payment's refund
// (StrayRefundStep), by order and step: what the reconciler looks at
// again until Stripe says each refund succeeded (StripeStatus), and counts
// meanwhile. It reads the partial index payment_attempts_stray_refunds
// only, so its cost follows the stray payments, which should be none.
func StrayRefunds(ctx context.Context, db *gorm.DB) ([]Attempt, error) {
	var as []Attempt
	if err := db.WithContext(ctx).Raw(straySQL).Scan(&as).Error; err != nil {
		return nil, fmt.Errorf("list the refunds of stray payments: %w", err)
	}
	return as, nil
}
