package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripeintent"
)

// Insert writes o, a new order (pending_payment), and its items inside
// tx. A duplicate id fails.
func Insert(ctx context.Context, tx *gorm.DB, o *Order) error {
	order, orderArgs, items, itemArgs := insertStatements(o)
	if err := tx.WithContext(ctx).Exec(order, orderArgs...).Error; err != nil {
		return fmt.Errorf("insert order %s: %w", o.ID, err)
	}
	if err := tx.WithContext(ctx).Exec(items, itemArgs...).Error; err != nil {
		return fmt.Errorf("insert items of order %s: %w", o.ID, err)
	}
	return nil
}

// RecordIntent records PaymentIntent piID (in Stripe status piStatus) as
// order id's (created, or adopted after an indeterminate create) unless
// one is recorded already, and returns the one recorded: the first wins,
// so concurrent runs agree. The status changes nothing.
func RecordIntent(ctx context.Context, db *gorm.DB, id, piID string, piStatus stripeintent.Status, now time.Time) (string, error) {
	var recorded string
	var b postgres.Batch
	QueueRecordFirstIntent(&b, id, piID, piStatus, now, &recorded)
	err := postgres.Send(ctx, db, &b)
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("record payment intent of %s: %w", id, err)
	}
	return recorded, nil
}

// recordIntentSQL is RecordIntent's UPDATE (recordIntentArgs), ending
// with its WHERE clause.
const recordIntentSQL = `
		UPDATE orders SET payment_intent_id = COALESCE(payment_intent_id, ?),
		    payment_status = CASE WHEN payment_intent_id IS NULL OR payment_intent_id = ? THEN ? ELSE payment_status END,
		    payment_unknown_since = NULL, updated_at = ?
		WHERE id = ?`

func recordIntentArgs(id, piID string, piStatus stripeintent.Status, now time.Time) []any {
	return []any{piID, piID, string(piStatus), now, id}
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

// Position is where a walk through the orders in one status stands: just
// after the order last listed, in the order (updated_at, id). The zero
// Position is the start.
type Position struct {
	UpdatedAt time.Time
	ID        string
}

// InStatus lists at most limit orders in status after position after, the
// least recently updated first, and returns the position after the last
// one listed (after itself when none is). Walking from the returned
// position lists every order in the status once before any again, however
// many rounds list the same orders without changing them: what keeps a
// poller's pages fair (the reconciler's). An order that changes moves to
// the end of the walk.
func InStatus(ctx context.Context, db *gorm.DB, status Status, after Position, limit int) ([]Ref, Position, error) {
	var rows []struct {
		TenantID, ID string
		UpdatedAt    time.Time
	}
	err := db.WithContext(ctx).Raw(`
		SELECT tenant_id, id, updated_at FROM orders WHERE status = ? AND (updated_at, id) > (?, ?)
		ORDER BY updated_at, id LIMIT ?`, string(status), after.UpdatedAt, after.ID, limit).Scan(&rows).Error
	if err != nil {
		return nil, after, fmt.Errorf("list orders in %s: %w", status, err)
	}
	refs := make([]Ref, len(rows))
	for i, r := range rows {
		refs[i] = Ref{TenantID: r.TenantID, ID: r.ID}
		after = Position{UpdatedAt: r.UpdatedAt, ID: r.ID}
	}
	return refs, after, nil
}

// Statuses returns the status of each order of ids that exists, by id.
func Statuses(ctx context.Context, db *gorm.DB, ids []string) (map[string]Status, error) {
	m := make(map[string]Status, len(ids))
	if len(ids) == 0 {
		return m, nil
	}
	var rows []struct{ ID, Status string }
	err := db.WithContext(ctx).Raw(`SELECT id, status FROM orders WHERE id = ANY(?::text[])`,
		postgres.TextArray(ids)).Scan(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("read the status of %d orders: %w", len(ids), err)
	}
	for _, r := range rows {
		m[r.ID] = Status(r.Status)
	}
	return m, nil
}

// OrphanSweepsDue returns up to limit of the orders ids whose payment has
// settled (their status is not Pending: no create of theirs can still be
// sent) and that were not searched for orphan PaymentIntents since
// checkedBefore (MarkOrphansChecked), the longest unsearched first (never
// searched before all). ids come from the step log (stripestep.Recreated):
// only orders with a second create can have an orphan.
func OrphanSweepsDue(ctx context.Context, db *gorm.DB, ids []string, checkedBefore time.Time, limit int) ([]Ref, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var refs []Ref
	err := db.WithContext(ctx).Raw(`
		SELECT tenant_id, id FROM orders
		WHERE id = ANY(?::text[]) AND status <> ALL(?::text[])
		  AND (payment_orphans_checked_at IS NULL OR payment_orphans_checked_at < ?)
		ORDER BY payment_orphans_checked_at NULLS FIRST, id LIMIT ?`,
		postgres.TextArray(ids), postgres.TextArray(texts(Pending())), checkedBefore, limit).Scan(&refs).Error
	if err != nil {
		return nil, fmt.Errorf("list orders to sweep for orphans: %w", err)
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
// RefundReserved and AmountRefunded <= AmountTotal; RefundReserved exceeds
// AmountTotal only while refunds in doubt outlast a refund made outside
// the service, migrations/00020).
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
// (LockBalance). The caller keeps it within the order's total (the schema
// refuses only succeeded refunds beyond it).
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
