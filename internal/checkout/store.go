package checkout

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripestep"
)

// listProducts returns the catalog ordered by sku.
func listProducts(ctx context.Context, db *gorm.DB) ([]Product, error) {
	var ps []Product
	if err := db.WithContext(ctx).Order("sku").Find(&ps).Error; err != nil {
		return nil, fmt.Errorf("list products: %w", err)
	}
	return ps, nil
}

// loadProducts returns the products with the given skus, without locking
// them and without their stock: prices and currencies do not change under a
// checkout, and stock is checked by reserve_stock. Unknown skus are absent
// from the map.
func loadProducts(ctx context.Context, tx *gorm.DB, skus []string) (map[string]Product, error) {
	// Rows, not Scan: GORM's Scan renders every statement with its values
	// inlined for a logger, on the checkout's hot path.
	rows, err := tx.WithContext(ctx).Raw(`SELECT sku, name, unit_amount, currency FROM product_catalog WHERE sku = ANY(?::text[])`,
		postgres.TextArray(skus)).Rows()
	if err != nil {
		return nil, fmt.Errorf("load products: %w", err)
	}
	defer rows.Close()
	m := make(map[string]Product, len(skus))
	for rows.Next() {
		var p Product
		if err := rows.Scan(&p.SKU, &p.Name, &p.UnitAmount, &p.Currency); err != nil {
			return nil, fmt.Errorf("load products: %w", err)
		}
		m[p.SKU] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load products: %w", err)
	}
	return m, nil
}

// Stock lives in 16 buckets per sku (table stock_buckets, migration 00003):
// a checkout takes its units from a bucket no other transaction holds, so
// checkouts of one hot sku do not queue on one row. The SQL functions
// reserve_stock and release_stock hold the rules; the view products shows
// each sku's total.

// sortedSKUs returns want's skus in order, and their quantities: every
// path that locks buckets of several skus locks them in this order, so
// concurrent checkouts cannot deadlock.
func sortedSKUs(want map[string]int64) ([]string, []int64) {
	skus := make([]string, 0, len(want))
	for sku := range want {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	qtys := make([]int64, len(skus))
	for i, sku := range skus {
		qtys[i] = want[sku]
	}
	return skus, qtys
}

// adjustStock gives delta[sku] units of each product back (a declined
// payment's reservation).
func adjustStock(ctx context.Context, tx *gorm.DB, delta map[string]int64) error {
	skus, qtys := sortedSKUs(delta)
	if err := tx.WithContext(ctx).Exec(`SELECT release_stock(?::text[], ?::bigint[])`,
		postgres.TextArray(skus), intArray(qtys)).Error; err != nil {
		return fmt.Errorf("release stock: %w", err)
	}
	return nil
}

// createOrderReserving is the rest of transaction 1, in one statement
// (data-modifying CTEs, one round trip instead of six): it reserves want's
// units and, only if that succeeded, inserts the order, its items and the
// event, and runs the key's fenced advance. It reports whether the stock
// was reserved (when not, it changed nothing) and whether the key was
// advanced (when reserved but not advanced, the lease was lost and the
// caller must roll back).
func createOrderReserving(ctx context.Context, tx *gorm.DB, o *Order, want map[string]int64,
	event string, eventArgs []any, advance string, advanceArgs []any) (reserved, advanced bool, err error) {
	skus, qtys := sortedSKUs(want)
	args := append([]any{postgres.TextArray(skus), intArray(qtys)}, orders.InsertArgs(o)...)
	args = append(append(args, eventArgs...), advanceArgs...)
	var advancedRows int64
	err = tx.WithContext(ctx).Raw(`
		WITH r AS MATERIALIZED (SELECT reserve_stock(?::text[], ?::bigint[]) AS ok),
		o AS (`+orders.InsertSQL+` FROM r WHERE r.ok RETURNING id),
		i AS (`+orders.InsertItemsSQL+`),
		e AS (`+event+` WHERE EXISTS (SELECT 1 FROM o)),
		k AS (`+advance+` AND EXISTS (SELECT 1 FROM o) RETURNING id)
		SELECT r.ok AS reserved, (SELECT count(*) FROM k) AS advanced FROM r`, args...).Row().Scan(&reserved, &advancedRows)
	if err != nil {
		return false, false, fmt.Errorf("insert order: %w", err)
	}
	return reserved, advancedRows == 1, nil
}

// intArray writes a PostgreSQL array literal of integers: GORM would expand
// a Go slice into a list of parameters (postgres.TextArray does the same
// for text).

func intArray(ns []int64) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(n, 10))
	}
	b.WriteByte('}')
	return b.String()
}

// loadOrder returns the order id of tenant, or ErrOrderNotFound (also for
// another tenant's order, so ids cannot be probed across tenants).
func loadOrder(ctx context.Context, db *gorm.DB, tenantID, id string) (*Order, error) {
	o, err := orders.Load(ctx, db, tenantID, id)
	if errors.Is(err, orders.ErrNotFound) {
		return nil, ErrOrderNotFound
	}
	return o, err
}

// releaseStock gives an order's reserved units back.
func releaseStock(ctx context.Context, tx *gorm.DB, o *Order) error {
	release := map[string]int64{}
	for _, it := range o.Items {
		release[it.SKU] += int64(it.Quantity)
	}
	return adjustStock(ctx, tx, release)
}

// attempt is one row of payment_attempts: one attempt of one saga step.
type attempt struct {
	ID              int64
	OrderID         string
	TenantID        string
	Step            string
	Attempt         int
	IdempotencyKey  string
	PaymentIntentID *string
	RequestParams   []byte
	// Outcome is nil while no final answer is recorded.
	Outcome        *string
	StripeObjectID *string
	StripeStatus   *string
	Error          *string
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

func (attempt) TableName() string { return "payment_attempts" }

// Attempt outcomes (payment_attempts.outcome).
const (
	outcomeSucceeded     = stripestep.Succeeded
	outcomeFailed        = stripestep.Failed
	outcomeIndeterminate = stripestep.Indeterminate
	outcomeRejected      = stripestep.Rejected
)

func (a *attempt) outcome() string {
	if a.Outcome == nil {
		return ""
	}
	return *a.Outcome
}

func (a *attempt) target() string {
	if a.PaymentIntentID == nil {
		return ""
	}
	return *a.PaymentIntentID
}

// loadAttempts returns the order's attempts of step (all steps when step is
// ""), in attempt order.
func loadAttempts(ctx context.Context, db *gorm.DB, orderID, step string) ([]attempt, error) {
	q := db.WithContext(ctx).Where("order_id = ?", orderID)
	if step != "" {
		q = q.Where("step = ?", step)
	}
	var as []attempt
	if err := q.Order("step, attempt").Find(&as).Error; err != nil {
		return nil, fmt.Errorf("load payment attempts of %s: %w", orderID, err)
	}
	return as, nil
}

// errAttemptTaken is returned by insertAttempt when another run inserted the
// same attempt first, or the key's lease is no longer ours: that run owns
// the step now.
var errAttemptTaken = errors.New("payment attempt taken by another run")

// insertAttempt writes attempt a before its call. With fenceKeyID set, the
// row is written only while the idempotency key fenceKeyID still names owner
// as its lease owner.
func insertAttempt(ctx context.Context, db *gorm.DB, a *attempt, fenceKeyID int64, owner string) error {
	var res *gorm.DB
	if fenceKeyID != 0 {
		res = db.WithContext(ctx).Raw(insertAttemptSQL+`
			WHERE EXISTS (SELECT 1 FROM idempotency_keys WHERE id = ? AND lease_owner = ?)
			ON CONFLICT DO NOTHING RETURNING id`, append(a.insertArgs(), fenceKeyID, owner)...).Scan(&a.ID)
	} else {
		res = db.WithContext(ctx).Raw(insertAttemptSQL+`
			ON CONFLICT DO NOTHING RETURNING id`, a.insertArgs()...).Scan(&a.ID)
	}
	if res.Error != nil {
		return fmt.Errorf("insert payment attempt %s: %w", a.IdempotencyKey, res.Error)
	}
	if res.RowsAffected != 1 {
		return errAttemptTaken
	}
	return nil
}

// insertAttemptSQL is the INSERT of an attempt (a.insertArgs), without its
// conditions: insertAttempt's and the first execution's statements add
// theirs.
const insertAttemptSQL = `INSERT INTO payment_attempts
			(order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
			SELECT ?, ?, ?, ?, ?, ?, ?::jsonb, ?, ?`

func (a *attempt) insertArgs() []any {
	return []any{a.OrderID, a.TenantID, a.Step, a.Attempt, a.IdempotencyKey, a.PaymentIntentID, string(a.RequestParams), a.CreatedAt, a.CreatedAt}
}

// finishAttempt records the answer to attempt id. outcome "" keeps the
// outcome open (no final answer yet) and records only the error.
func finishAttempt(ctx context.Context, db *gorm.DB, id int64, outcome string, pi *PaymentIntentState, errText string, now time.Time) error {
	err := db.WithContext(ctx).Exec(finishAttemptSQL, finishAttemptArgs(id, outcome, pi, errText, now)...).Error
	if err != nil {
		return fmt.Errorf("record payment attempt %d: %w", id, err)
	}
	return nil
}

// finishAttemptSQL is finishAttempt's UPDATE, also run inside the first
// execution's statements.
const finishAttemptSQL = `
		UPDATE payment_attempts SET outcome = COALESCE(NULLIF(?, ''), outcome),
		    stripe_object_id = COALESCE(?, stripe_object_id), stripe_status = COALESCE(?, stripe_status),
		    error = NULLIF(?, ''), updated_at = ?
		WHERE id = ?`

func finishAttemptArgs(id int64, outcome string, pi *PaymentIntentState, errText string, now time.Time) []any {
	var objID, status any
	if pi != nil && pi.ID != "" {
		objID, status = pi.ID, pi.Status
	}
	return []any{outcome, objID, status, errText, now, id}
}

func notificationsFor(ctx context.Context, db *gorm.DB, orderID string) ([]Notification, error) {
	ns := []Notification{}
	err := db.WithContext(ctx).Raw(`
		SELECT channel, kind, status, sent_at FROM notifications WHERE order_id = ?
		ORDER BY channel, coalesce(event_seq, 0), created_at`, orderID).
		Scan(&ns).Error
	if err != nil {
		return nil, fmt.Errorf("load notifications of %s: %w", orderID, err)
	}
	for i := range ns {
		if ns[i].SentAt != nil {
			t := ns[i].SentAt.UTC()
			ns[i].SentAt = &t
		}
	}
	return ns, nil
}
