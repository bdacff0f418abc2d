package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripestep"
)

// orderRow and itemRow are the GORM models of orders and order_items.
type orderRow struct {
	ID              string `gorm:"primaryKey"`
	TenantID        string
	Status          string
	Email           string
	Currency        string
	AmountTotal     int64
	PaymentMethod   string
	ReturnURL       *string // migration 00008
	PaymentIntentID *string
	PaymentStatus   *string
	// The payment saga's columns (migration 00002).
	PaymentNextAction   []byte
	PaymentClientSecret *string
	PaymentFailureCode  *string
	PaymentDeclineCode  *string
	RequiresActionAt    *time.Time
	PaymentUnknownSince *time.Time
	CreatedAt           time.Time
	UpdatedAt           time.Time
	Items               []itemRow `gorm:"foreignKey:OrderID"`
}

func (orderRow) TableName() string { return "orders" }

type itemRow struct {
	OrderID    string `gorm:"primaryKey"`
	Line       int    `gorm:"primaryKey"`
	SKU        string `gorm:"column:sku"`
	Quantity   int
	UnitAmount int64
	Amount     int64
}

func (itemRow) TableName() string { return "order_items" }

func (r *orderRow) order() *Order {
	o := &Order{
		ID:            r.ID,
		Status:        r.Status,
		Email:         r.Email,
		Currency:      r.Currency,
		AmountTotal:   r.AmountTotal,
		Payment:       Payment{Provider: "stripe"},
		CreatedAt:     r.CreatedAt.UTC(),
		tenantID:      r.TenantID,
		paymentMethod: r.PaymentMethod,
	}
	if r.ReturnURL != nil {
		o.returnURL = *r.ReturnURL
	}
	if r.PaymentIntentID != nil {
		o.Payment.PaymentIntentID = *r.PaymentIntentID
	}
	if r.PaymentStatus != nil {
		o.Payment.Status = *r.PaymentStatus
	}
	if r.Status == StatusRequiresAction {
		// Shown only while the customer has something to do.
		if len(r.PaymentNextAction) > 0 {
			o.Payment.NextAction = json.RawMessage(r.PaymentNextAction)
		}
		if r.PaymentClientSecret != nil {
			o.Payment.ClientSecret = *r.PaymentClientSecret
		}
	}
	if r.PaymentFailureCode != nil {
		o.failureCode = *r.PaymentFailureCode
	}
	if r.PaymentDeclineCode != nil {
		o.declineCode = *r.PaymentDeclineCode
	}
	if r.RequiresActionAt != nil {
		t := r.RequiresActionAt.UTC()
		o.requiresActionAt = &t
	}
	if r.PaymentUnknownSince != nil {
		t := r.PaymentUnknownSince.UTC()
		o.unknownSince = &t
	}
	sort.Slice(r.Items, func(i, j int) bool { return r.Items[i].Line < r.Items[j].Line })
	o.Items = make([]OrderItem, len(r.Items))
	for i, it := range r.Items {
		o.Items[i] = OrderItem{SKU: it.SKU, Quantity: it.Quantity, UnitAmount: it.UnitAmount, Amount: it.Amount}
	}
	return o
}

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
	args := append([]any{postgres.TextArray(skus), intArray(qtys)}, orderArgs(o)...)
	args = append(append(args, eventArgs...), advanceArgs...)
	var advancedRows int64
	err = tx.WithContext(ctx).Raw(`
		WITH r AS MATERIALIZED (SELECT reserve_stock(?::text[], ?::bigint[]) AS ok),
		o AS (`+insertOrderSQL+` FROM r WHERE r.ok RETURNING id),
		i AS (`+insertItemsSQL+`),
		e AS (`+event+` WHERE EXISTS (SELECT 1 FROM o)),
		k AS (`+advance+` AND EXISTS (SELECT 1 FROM o) RETURNING id)
		SELECT r.ok AS reserved, (SELECT count(*) FROM k) AS advanced FROM r`, args...).Row().Scan(&reserved, &advancedRows)
	if err != nil {
		return false, false, fmt.Errorf("insert order: %w", err)
	}
	return reserved, advancedRows == 1, nil
}

// insertOrderSQL and insertItemsSQL insert an order and its items
// (orderArgs, in this order) inside a statement of data-modifying CTEs: the
// order's INSERT ... SELECT takes the caller's FROM (and condition), and the
// items' is over the order's CTE, o, so they exist only if it does.
const (
	insertOrderSQL = `
			INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, return_url, created_at, updated_at)
			SELECT ?, ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?::timestamptz, ?::timestamptz`
	insertItemsSQL = `
			INSERT INTO order_items (order_id, line, sku, quantity, unit_amount, amount)
			SELECT o.id, t.line, t.sku, t.quantity, t.unit_amount, t.amount
			FROM o, unnest(?::int[], ?::text[], ?::int[], ?::bigint[], ?::bigint[]) AS t (line, sku, quantity, unit_amount, amount)`
)

// orderArgs are the arguments of insertOrderSQL then insertItemsSQL for o.
func orderArgs(o *Order) []any {
	n := len(o.Items)
	lines, itemSKUs, quantities, unitAmounts, amounts := make([]int64, n), make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, it := range o.Items {
		lines[i], itemSKUs[i], quantities[i], unitAmounts[i], amounts[i] = int64(i+1), it.SKU, int64(it.Quantity), it.UnitAmount, it.Amount
	}
	return []any{o.ID, o.tenantID, o.Status, o.Email, o.Currency, o.AmountTotal, o.paymentMethod, o.returnURL, o.CreatedAt, o.CreatedAt,
		intArray(lines), postgres.TextArray(itemSKUs), intArray(quantities), intArray(unitAmounts), intArray(amounts)}
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
	var row orderRow
	err := db.WithContext(ctx).Preload("Items").Where("id = ? AND tenant_id = ?", id, tenantID).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrOrderNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("load order %s: %w", id, err)
	}
	return row.order(), nil
}

// transitionFrom lists, for each status an order can move to, the statuses
// it may leave for it. Every status change goes through transition, whose
// WHERE clause names them: statuses only move forward, whoever applies
// them (the API, the completer, the reconciler, a webhook) and in whatever
// order.
var transitionFrom = map[string][]string{
	StatusPaymentUnknown: {StatusPendingPayment},
	StatusRequiresAction: {StatusPendingPayment, StatusPaymentUnknown},
	StatusPaid:           {StatusPendingPayment, StatusPaymentUnknown, StatusRequiresAction},
	StatusPaymentFailed:  {StatusPendingPayment, StatusPaymentUnknown, StatusRequiresAction},
	StatusCanceled:       {StatusRequiresAction},
}

// change is one status change of an order and the payment fields that come
// with it.
type change struct {
	to              string
	paymentIntentID string // "" keeps the recorded one
	paymentStatus   string
	nextAction      json.RawMessage // requires_action only
	clientSecret    string          // requires_action only
	failureCode     string          // payment_failed, canceled
	declineCode     string
	// closed: the order's PaymentIntent can no longer move money (see
	// closeBeforeExit); applyTx refuses an exit without it.
	closed bool
}

// transition applies ch to order id inside tx if the order's current status
// may move to ch.to, and reports whether it did. A false is not an error: the
// order is already there or past it.
func transition(ctx context.Context, tx *gorm.DB, id string, ch change, now time.Time) (bool, error) {
	query, args, err := transitionStatement(id, ch, now)
	if err != nil {
		return false, err
	}
	res := tx.WithContext(ctx).Exec(query, args...)
	if res.Error != nil {
		return false, fmt.Errorf("order %s to %s: %w", id, ch.to, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// transitionStatement returns transition's UPDATE and its arguments, for a
// caller that runs it inside a larger statement. It ends with its WHERE
// clause, so the caller may add conditions and a RETURNING.
func transitionStatement(id string, ch change, now time.Time) (string, []any, error) {
	from, ok := transitionFrom[ch.to]
	if !ok {
		return "", nil, fmt.Errorf("transition order %s: no transition to %q", id, ch.to)
	}
	var next any
	if len(ch.nextAction) > 0 {
		next = string(ch.nextAction)
	}
	return `
		UPDATE orders SET status = ?,
		    payment_intent_id = COALESCE(NULLIF(?, ''), payment_intent_id),
		    payment_status = COALESCE(NULLIF(?, ''), payment_status),
		    payment_next_action = CASE WHEN ? = 'requires_action' THEN ?::jsonb ELSE payment_next_action END,
		    payment_client_secret = CASE WHEN ? = 'requires_action' THEN NULLIF(?, '') ELSE payment_client_secret END,
		    payment_failure_code = NULLIF(?, ''),
		    payment_decline_code = NULLIF(?, ''),
		    requires_action_at = CASE WHEN ? = 'requires_action' THEN ? ELSE requires_action_at END,
		    payment_unknown_since = CASE WHEN ? = 'payment_unknown' THEN payment_unknown_since ELSE NULL END,
		    updated_at = ?
		WHERE id = ? AND status IN ?`,
		[]any{ch.to, ch.paymentIntentID, ch.paymentStatus,
			ch.to, next, ch.to, ch.clientSecret,
			ch.failureCode, ch.declineCode,
			ch.to, now, ch.to, now, id, from}, nil
}

// recordIntent records the order's PaymentIntent (created, or adopted after
// an indeterminate create) unless one is recorded already, and returns the
// one recorded: the first wins, so concurrent runs agree.
func recordIntent(ctx context.Context, db *gorm.DB, orderID string, pi PaymentIntentState, now time.Time) (string, error) {
	var id string
	err := db.WithContext(ctx).Raw(recordIntentSQL+` RETURNING payment_intent_id`, recordIntentArgs(orderID, pi, now)...).Scan(&id).Error
	if err != nil {
		return "", fmt.Errorf("record payment intent of %s: %w", orderID, err)
	}
	return id, nil
}

// recordIntentSQL is recordIntent's UPDATE without its RETURNING, also run
// inside recordCreated's statement.
const recordIntentSQL = `
		UPDATE orders SET payment_intent_id = COALESCE(payment_intent_id, ?),
		    payment_status = CASE WHEN payment_intent_id IS NULL OR payment_intent_id = ? THEN ? ELSE payment_status END,
		    payment_unknown_since = NULL, updated_at = ?
		WHERE id = ?`

func recordIntentArgs(orderID string, pi PaymentIntentState, now time.Time) []any {
	return []any{pi.ID, pi.ID, pi.Status, now, orderID}
}

// markUnknownSince records when the order's payment first became unknown
// (an unanswered or indeterminate step), keeping an earlier time.
func markUnknownSince(ctx context.Context, db *gorm.DB, orderID string, now time.Time) error {
	err := db.WithContext(ctx).Exec(`
		UPDATE orders SET payment_unknown_since = COALESCE(payment_unknown_since, ?)
		WHERE id = ? AND status IN ?`, now, orderID, []string{StatusPendingPayment, StatusPaymentUnknown}).Error
	if err != nil {
		return fmt.Errorf("mark payment of %s unknown: %w", orderID, err)
	}
	return nil
}

// releaseStock gives an order's reserved units back.
func releaseStock(ctx context.Context, tx *gorm.DB, o *Order) error {
	release := map[string]int64{}
	for _, it := range o.Items {
		release[it.SKU] += int64(it.Quantity)
	}
	return adjustStock(ctx, tx, release)
}

// leaseFence is the fence of a run's writes to the step log: the
// idempotency key keyID still leased to owner. keyID 0 (a run without a
// key: the reconciler) writes unfenced.
func leaseFence(keyID int64, owner string) stripestep.Fence {
	if keyID == 0 {
		return stripestep.Fence{}
	}
	return stripestep.Fence{Cond: `EXISTS (SELECT 1 FROM idempotency_keys WHERE id = ? AND lease_owner = ?)`,
		Args: []any{keyID, owner}}
}
