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
	PaymentIntentID *string
	PaymentStatus   *string
	CreatedAt       time.Time
	UpdatedAt       time.Time
	Items           []itemRow `gorm:"foreignKey:OrderID"`
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
	if r.PaymentIntentID != nil {
		o.Payment.PaymentIntentID = *r.PaymentIntentID
	}
	if r.PaymentStatus != nil {
		o.Payment.Status = *r.PaymentStatus
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
		textArray(skus)).Rows()
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
		textArray(skus), intArray(qtys)).Error; err != nil {
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
	n := len(o.Items)
	lines, itemSKUs, quantities, unitAmounts, amounts := make([]int64, n), make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, it := range o.Items {
		lines[i], itemSKUs[i], quantities[i], unitAmounts[i], amounts[i] = int64(i+1), it.SKU, int64(it.Quantity), it.UnitAmount, it.Amount
	}
	args := []any{textArray(skus), intArray(qtys),
		o.ID, o.tenantID, o.Status, o.Email, o.Currency, o.AmountTotal, o.paymentMethod, o.CreatedAt, o.CreatedAt,
		intArray(lines), textArray(itemSKUs), intArray(quantities), intArray(unitAmounts), intArray(amounts)}
	args = append(append(args, eventArgs...), advanceArgs...)
	var advancedRows int64
	err = tx.WithContext(ctx).Raw(`
		WITH r AS MATERIALIZED (SELECT reserve_stock(?::text[], ?::bigint[]) AS ok),
		o AS (
			INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
			SELECT ?, ?, ?, ?, ?, ?, ?, ?::timestamptz, ?::timestamptz FROM r WHERE r.ok
			RETURNING id),
		i AS (
			INSERT INTO order_items (order_id, line, sku, quantity, unit_amount, amount)
			SELECT o.id, t.line, t.sku, t.quantity, t.unit_amount, t.amount
			FROM o, unnest(?::int[], ?::text[], ?::int[], ?::bigint[], ?::bigint[]) AS t (line, sku, quantity, unit_amount, amount)),
		e AS (`+event+` WHERE EXISTS (SELECT 1 FROM o)),
		k AS (`+advance+` AND EXISTS (SELECT 1 FROM o) RETURNING id)
		SELECT r.ok AS reserved, (SELECT count(*) FROM k) AS advanced FROM r`, args...).Row().Scan(&reserved, &advancedRows)
	if err != nil {
		return false, false, fmt.Errorf("insert order: %w", err)
	}
	return reserved, advancedRows == 1, nil
}

// textArray and intArray write PostgreSQL array literals: GORM would expand
// a Go slice into a list of parameters.
func textArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

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

// settleOrder moves a pending order to its final status. It fails when the
// order is no longer pending, which the key's fencing makes impossible.
func settleOrder(ctx context.Context, tx *gorm.DB, o *Order, now time.Time) error {
	res := tx.WithContext(ctx).Exec(`
		UPDATE orders SET status = ?, payment_intent_id = ?, payment_status = ?, updated_at = ?
		WHERE id = ? AND status = ?`,
		o.Status, o.Payment.PaymentIntentID, o.Payment.Status, now, o.ID, StatusPendingPayment)
	if res.Error != nil {
		return fmt.Errorf("settle order %s: %w", o.ID, res.Error)
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("settle order %s: not pending", o.ID)
	}
	return nil
}

func notificationsFor(ctx context.Context, db *gorm.DB, orderID string) ([]Notification, error) {
	ns := []Notification{}
	err := db.WithContext(ctx).Raw(`
		SELECT channel, status, sent_at FROM notifications WHERE order_id = ? ORDER BY channel`, orderID).
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
