package refunds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripestep"
)

// refundRow is the GORM model of refunds.
type refundRow struct {
	ID               string `gorm:"primaryKey"`
	OrderID          string
	TenantID         string
	IdempotencyKeyID *int64
	Amount           int64
	Currency         string
	Reason           *string
	Status           Status
	PaymentIntentID  string
	StripeRefundID   *string
	StripeStatus     *string
	FailureReason    *string
	CreatedAt        time.Time
	UpdatedAt        time.Time
	SettledAt        *time.Time
}

func (refundRow) TableName() string { return "refunds" }

// reason is the refund's reason, "" for none.
func (r *refundRow) reason() string {
	if r.Reason == nil {
		return ""
	}
	return *r.Reason
}

func (r *refundRow) view() Refund {
	return Refund{
		ID: r.ID, OrderID: r.OrderID, Amount: r.Amount, Currency: r.Currency, Reason: r.Reason,
		Status: r.Status, StripeRefundID: r.StripeRefundID, FailureReason: r.FailureReason,
		CreatedAt: r.CreatedAt.UTC(),
	}
}

// lockOrder loads the balance of tenant's order id ("" tenant: any) with
// its row locked until tx ends (orders.LockBalance), or returns
// ErrOrderNotFound. The lock serializes everything that changes an order's
// refunds: new refunds and Stripe's outcomes.
func lockOrder(ctx context.Context, tx *gorm.DB, tenantID, id string) (*orders.Balance, error) {
	o, err := orders.LockBalance(ctx, tx, tenantID, id)
	if errors.Is(err, orders.ErrNotFound) {
		return nil, ErrOrderNotFound
	}
	return o, err
}

// loadRefund returns the refund id; lock locks its row until tx ends.
func loadRefund(ctx context.Context, tx *gorm.DB, id string, lock bool) (*refundRow, error) {
	var r refundRow
	q := tx.WithContext(ctx).Where("id = ?", id)
	if lock {
		q = q.Clauses(clause.Locking{Strength: "UPDATE"})
	}
	if err := q.Take(&r).Error; err != nil {
		return nil, fmt.Errorf("load refund %s: %w", id, err)
	}
	return &r, nil
}

// refundOfKey returns the refund created under idempotency key row keyID.
func refundOfKey(ctx context.Context, tx *gorm.DB, keyID int64) (*refundRow, error) {
	var r refundRow
	if err := tx.WithContext(ctx).Where("idempotency_key_id = ?", keyID).Take(&r).Error; err != nil {
		return nil, fmt.Errorf("load refund of key %d: %w", keyID, err)
	}
	return &r, nil
}

// ForOrder returns the refunds of orderID, oldest first, as the API shows
// them (GET /v1/orders/{id}).
func ForOrder(ctx context.Context, db *gorm.DB, orderID string) ([]Refund, error) {
	var rows []refundRow
	if err := db.WithContext(ctx).Where("order_id = ?", orderID).Order("created_at, id").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("load refunds of %s: %w", orderID, err)
	}
	out := make([]Refund, len(rows))
	for i := range rows {
		out[i] = rows[i].view()
	}
	return out, nil
}

// insertAttempt writes attempt n of r's step (stripestep.RefundStep),
// before its call: the refund's POST /v1/refunds under
// stripestep.Key(order, step, n).
func insertAttempt(ctx context.Context, tx *gorm.DB, r *refundRow, n int, now time.Time) (*stripestep.Attempt, error) {
	params, err := json.Marshal(map[string]any{
		"payment_intent": r.PaymentIntentID, "amount": r.Amount, "reason": r.Reason,
		"metadata": map[string]string{"refund_id": r.ID, "order_id": r.OrderID, "tenant_id": r.TenantID},
	})
	if err != nil {
		return nil, err
	}
	a := stripestep.NewAttempt(r.OrderID, r.TenantID, stripestep.RefundStep(r.ID), n, r.PaymentIntentID, params, now)
	if err := stripestep.Insert(ctx, tx, a); err != nil {
		return nil, err
	}
	return a, nil
}

// latestAttempt returns the highest attempt of r's step (nil if none).
func latestAttempt(ctx context.Context, db *gorm.DB, r *refundRow) (*stripestep.Attempt, error) {
	return stripestep.Latest(ctx, db, r.OrderID, stripestep.RefundStep(r.ID))
}

// recordAttempt stores the answer to attempt a after its call: outcome,
// the refund Stripe answered with (st, if any) and the call's error (cause,
// if any). stripestep.Open records only the error, on an attempt still
// open, so that its key is resent. A failure to record is harmless: the
// attempt stays open, and the next run resends its key, which Stripe
// answers as it did.
func recordAttempt(ctx context.Context, db *gorm.DB, a *stripestep.Attempt, outcome stripestep.Outcome, st *StripeRefund, cause error, now time.Time) error {
	answer := stripestep.Answer{Outcome: outcome}
	if st != nil {
		answer.ObjectID, answer.Status = st.ID, st.Status
	}
	if cause != nil {
		answer.Error = cause.Error()
	}
	if err := stripestep.Finish(ctx, db, a, answer, now); err != nil {
		return fmt.Errorf("record attempt %d of %s: %w", a.Attempt, a.Step, err)
	}
	if outcome != stripestep.Open {
		a.Outcome, a.UpdatedAt = outcome, now
	}
	return nil
}
