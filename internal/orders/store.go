package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/onceonly/checkout/internal/postgres"
)

// InsertSQL and InsertItemsSQL insert an order and its items (InsertArgs,
// in this order) inside a statement of data-modifying CTEs, the checkout's
// one round trip that also reserves the stock and claims or advances the
// key: the order's INSERT ... SELECT takes the caller's FROM (and
// condition), and the items' is over the order's CTE, which must be named
// o, so they exist only if it does.
const (
	InsertSQL = `
			INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, return_url, created_at, updated_at)
			SELECT ?, ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?::timestamptz, ?::timestamptz`
	InsertItemsSQL = `
			INSERT INTO order_items (order_id, line, sku, quantity, unit_amount, amount)
			SELECT o.id, t.line, t.sku, t.quantity, t.unit_amount, t.amount
			FROM o, unnest(?::int[], ?::text[], ?::int[], ?::bigint[], ?::bigint[]) AS t (line, sku, quantity, unit_amount, amount)`
)

// InsertArgs are the arguments of InsertSQL then InsertItemsSQL for o, a
// new order (pending_payment).
func InsertArgs(o *Order) []any {
	n := len(o.Items)
	lines, itemSKUs, quantities, unitAmounts, amounts := make([]int64, n), make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, it := range o.Items {
		lines[i], itemSKUs[i], quantities[i], unitAmounts[i], amounts[i] = int64(i+1), it.SKU, int64(it.Quantity), it.UnitAmount, it.Amount
	}
	return []any{o.ID, o.TenantID, string(o.Status), o.Email, o.Currency, o.AmountTotal, o.PaymentMethod, o.ReturnURL, o.CreatedAt, o.CreatedAt,
		postgres.IntArray(lines), postgres.TextArray(itemSKUs), postgres.IntArray(quantities), postgres.IntArray(unitAmounts), postgres.IntArray(amounts)}
}

// RecordIntent records PaymentIntent piID (in Stripe status piStatus) as
// order id's (created, or adopted after an indeterminate create) unless
// one is recorded already, and returns the one recorded: the first wins,
// so concurrent runs agree. The status changes nothing.
func RecordIntent(ctx context.Context, db *gorm.DB, id, piID, piStatus string, now time.Time) (string, error) {
	var recorded string
	err := db.WithContext(ctx).Raw(RecordIntentSQL+` RETURNING payment_intent_id`, RecordIntentArgs(id, piID, piStatus, now)...).Scan(&recorded).Error
	if err != nil {
		return "", fmt.Errorf("record payment intent of %s: %w", id, err)
	}
	return recorded, nil
}

// RecordIntentSQL is RecordIntent's UPDATE (RecordIntentArgs) without its
// RETURNING, for the checkout's fast path, which runs it inside one
// statement with the create's answer and the confirm's attempt.
const RecordIntentSQL = `
		UPDATE orders SET payment_intent_id = COALESCE(payment_intent_id, ?),
		    payment_status = CASE WHEN payment_intent_id IS NULL OR payment_intent_id = ? THEN ? ELSE payment_status END,
		    payment_unknown_since = NULL, updated_at = ?
		WHERE id = ?`

// RecordIntentArgs are RecordIntentSQL's arguments.
func RecordIntentArgs(id, piID, piStatus string, now time.Time) []any {
	return []any{piID, piID, piStatus, now, id}
}

// MarkUnknownSince records that the payment of order id became unknown at
// now (an unanswered or indeterminate step), keeping an earlier time, while
// the order is Pending.
func MarkUnknownSince(ctx context.Context, db *gorm.DB, id string, now time.Time) error {
	err := db.WithContext(ctx).Exec(`
		UPDATE orders SET payment_unknown_since = COALESCE(payment_unknown_since, ?)
		WHERE id = ? AND status IN ?`, now, id, texts(Pending())).Error
	if err != nil {
		return fmt.Errorf("mark payment of %s unknown: %w", id, err)
	}
	return nil
}

// MarkOrphansChecked records that order id was searched for orphan
// PaymentIntents at now.
func MarkOrphansChecked(ctx context.Context, db *gorm.DB, id string, now time.Time) error {
	err := db.WithContext(ctx).Exec(`UPDATE orders SET payment_orphans_checked_at = ? WHERE id = ?`, now, id).Error
	if err != nil {
		return fmt.Errorf("record orphan sweep of %s: %w", id, err)
	}
	return nil
}

// Ref names an order: its tenant and id.
type Ref struct {
	TenantID, ID string
}

// InStatus lists at most limit orders in status, the least recently
// updated first.
func InStatus(ctx context.Context, db *gorm.DB, status Status, limit int) ([]Ref, error) {
	var refs []Ref
	err := db.WithContext(ctx).Raw(`
		SELECT tenant_id, id FROM orders WHERE status = ?
		ORDER BY updated_at LIMIT ?`, string(status), limit).Scan(&refs).Error
	if err != nil {
		return nil, fmt.Errorf("list orders in %s: %w", status, err)
	}
	return refs, nil
}

// Count returns how many orders are in each of statuses (0 for none).
func Count(ctx context.Context, db *gorm.DB, statuses ...Status) (map[Status]int64, error) {
	var rows []struct {
		Status string
		N      int64
	}
	err := db.WithContext(ctx).Raw(`SELECT status, count(*) AS n FROM orders WHERE status IN ? GROUP BY status`,
		texts(statuses)).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("count orders: %w", err)
	}
	m := make(map[Status]int64, len(statuses))
	for _, s := range statuses {
		m[s] = 0
	}
	for _, r := range rows {
		m[Status(r.Status)] = r.N
	}
	return m, nil
}

// Balance is what a refund reads of its order. Amounts are in the
// currency's minor unit: RefundReserved counts pending and succeeded
// refunds, AmountRefunded succeeded ones (a CHECK keeps AmountRefunded <=
// RefundReserved <= AmountTotal).
type Balance struct {
	ID              string
	TenantID        string
	Status          Status
	Currency        string
	AmountTotal     int64
	RefundReserved  int64
	AmountRefunded  int64
	PaymentIntentID *string
}

// LockBalance loads the balance of tenant's order id ("" tenant: any) with
// its row locked until tx ends, or returns ErrNotFound. The lock serializes
// everything that changes an order's refunds: new refunds and Stripe's
// outcomes.
func LockBalance(ctx context.Context, tx *gorm.DB, tenantID, id string) (*Balance, error) {
	var b Balance
	q := tx.WithContext(ctx).Model(&orderRow{}).Clauses(clause.Locking{Strength: "UPDATE"}).
		Select("id, tenant_id, status, currency, amount_total, refund_reserved, amount_refunded, payment_intent_id").
		Where("id = ?", id)
	if tenantID != "" {
		q = q.Where("tenant_id = ?", tenantID)
	}
	err := q.Take(&b).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("lock order %s: %w", id, err)
	}
	return &b, nil
}

// Reserve adds amount (negative: gives it back) to what refunds of order
// id hold (refund_reserved), inside tx, which holds the order's row
// (LockBalance). The schema refuses more than the order's total.
func Reserve(ctx context.Context, tx *gorm.DB, id string, amount int64, now time.Time) error {
	err := tx.WithContext(ctx).Exec(`UPDATE orders SET refund_reserved = refund_reserved + ?, updated_at = ? WHERE id = ?`,
		amount, now, id).Error
	if err != nil {
		return fmt.Errorf("reserve refund of %s: %w", id, err)
	}
	return nil
}

// SettleRefund applies a refund's settlement to order id inside tx, which
// holds the order's row (LockBalance): reserved is added to what refunds
// hold and refunded to what they refunded (both negative when Stripe fails
// a refund that had succeeded). A refund that succeeded (refunded > 0)
// moves the order through Apply to partially_refunded, or refunded once
// refunds cover its total; the transitions table decides whether it may
// (a failure never moves the status back). Neither writes an event: the
// caller adds order.refunded, with the refund.
func SettleRefund(ctx context.Context, tx *gorm.DB, id string, reserved, refunded int64, now time.Time) error {
	var after []struct{ AmountTotal, AmountRefunded int64 }
	err := tx.WithContext(ctx).Raw(`UPDATE orders SET
		    refund_reserved = refund_reserved + ?,
		    amount_refunded = amount_refunded + ?,
		    updated_at = ?
		WHERE id = ? RETURNING amount_total, amount_refunded`, reserved, refunded, now, id).Scan(&after).Error
	if err != nil {
		return fmt.Errorf("update order %s after a refund: %w", id, err)
	}
	if len(after) == 0 {
		return fmt.Errorf("order %s: %w", id, ErrNotFound)
	}
	if refunded <= 0 {
		return nil
	}
	to := PartiallyRefunded
	if after[0].AmountRefunded >= after[0].AmountTotal {
		to = Refunded
	}
	_, err = Apply(ctx, tx, id, Change{To: to}, now)
	return err
}
