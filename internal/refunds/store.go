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
	Status           string
	PaymentIntentID  string
	StripeRefundID   *string
	StripeStatus     *string
	FailureReason    *string
	CreatedAt        time.Time
	UpdatedAt        time.Time
	SettledAt        *time.Time
}

func (refundRow) TableName() string { return "refunds" }

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

// attemptRow is one row of the saga's step log, payment_attempts.
type attemptRow struct {
	ID              int64
	OrderID         string
	TenantID        string
	Step            string
	Attempt         int
	IdempotencyKey  string
	PaymentIntentID *string
	RequestParams   string
	Outcome         *string
	StripeObjectID  *string
	StripeStatus    *string
	Error           *string
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

func (attemptRow) TableName() string { return "payment_attempts" }

// Outcomes of an attempt (payment_attempts.outcome). NULL: sent, or about
// to be, with no answer recorded: it may be resent under the same key.
const (
	outcomeSucceeded     = stripestep.Succeeded
	outcomeRejected      = stripestep.Rejected
	outcomeIndeterminate = stripestep.Indeterminate
)

// step is the saga step of refund id.
func step(refundID string) string { return "refund:" + refundID }

// insertAttempt writes attempt n of r's step, before its call.
func insertAttempt(ctx context.Context, tx *gorm.DB, r *refundRow, n int, now time.Time) (*attemptRow, error) {
	params, err := json.Marshal(map[string]any{
		"payment_intent": r.PaymentIntentID, "amount": r.Amount, "reason": r.Reason,
		"metadata": map[string]string{"refund_id": r.ID, "order_id": r.OrderID, "tenant_id": r.TenantID},
	})
	if err != nil {
		return nil, err
	}
	a := &attemptRow{
		OrderID: r.OrderID, TenantID: r.TenantID, Step: step(r.ID), Attempt: n,
		IdempotencyKey: stripestep.Key(r.OrderID, step(r.ID), n), PaymentIntentID: &r.PaymentIntentID,
		RequestParams: string(params), CreatedAt: now, UpdatedAt: now,
	}
	if err := tx.WithContext(ctx).Create(a).Error; err != nil {
		return nil, fmt.Errorf("insert attempt %d of %s: %w", n, a.Step, err)
	}
	return a, nil
}

// latestAttempt returns the highest attempt of r's step (nil if none).
func latestAttempt(ctx context.Context, db *gorm.DB, r *refundRow) (*attemptRow, error) {
	var rows []attemptRow
	err := db.WithContext(ctx).Where("order_id = ? AND step = ?", r.OrderID, step(r.ID)).
		Order("attempt DESC").Limit(1).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("load attempts of %s: %w", step(r.ID), err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	return &rows[0], nil
}

// recordAttempt stores the outcome of attempt a after its call. A failure
// to record is harmless: the attempt stays "sent", and the next run resends
// its key, which Stripe answers as it did.
func recordAttempt(ctx context.Context, db *gorm.DB, a *attemptRow, outcome string, st *StripeRefund, cause error, now time.Time) error {
	updates := map[string]any{"outcome": outcome, "updated_at": now}
	if st != nil {
		updates["stripe_object_id"], updates["stripe_status"] = st.ID, st.Status
	}
	if cause != nil {
		msg := cause.Error()
		if len(msg) > 1000 {
			msg = msg[:1000]
		}
		updates["error"] = msg
	}
	if err := db.WithContext(ctx).Model(&attemptRow{}).Where("id = ?", a.ID).Updates(updates).Error; err != nil {
		return fmt.Errorf("record attempt %d of %s: %w", a.Attempt, a.Step, err)
	}
	a.Outcome, a.UpdatedAt = &outcome, now
	return nil
}

// noteAttemptError records the last error of an attempt that got no answer,
// for people; its outcome stays open (NULL), so its key is resent.
func noteAttemptError(ctx context.Context, db *gorm.DB, a *attemptRow, cause error, now time.Time) error {
	msg := cause.Error()
	if len(msg) > 1000 {
		msg = msg[:1000]
	}
	if err := db.WithContext(ctx).Model(&attemptRow{}).Where("id = ? AND outcome IS NULL", a.ID).
		Updates(map[string]any{"error": msg, "updated_at": now}).Error; err != nil {
		return fmt.Errorf("record error of attempt %d of %s: %w", a.Attempt, a.Step, err)
	}
	return nil
}
