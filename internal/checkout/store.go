package checkout

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
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

// loadOrder returns the order id of tenant, or ErrOrderNotFound (also for
// another tenant's order, so ids cannot be probed across tenants).
func loadOrder(ctx context.Context, db *gorm.DB, tenantID, id string) (*orders.Order, error) {
	o, err := orders.Load(ctx, db, tenantID, id)
	if errors.Is(err, orders.ErrNotFound) {
		return nil, ErrOrderNotFound
	}
	return o, err
}

// lockOrder locks the row of tenant's order id until tx ends and returns
// the order, or ErrOrderNotFound: in a keyed transaction, only after the
// key (idempotency.Fence, "Lock order").
func lockOrder(ctx context.Context, tx *gorm.DB, tenantID, id string) (*orders.Order, error) {
	if err := orders.Lock(ctx, tx, tenantID, id); err != nil {
		if errors.Is(err, orders.ErrNotFound) {
			return nil, ErrOrderNotFound
		}
		return nil, err
	}
	return loadOrder(ctx, tx, tenantID, id)
}

// queueRelease queues in b the return of an order's reserved units (a
// payment that failed, an order canceled).
func queueRelease(b *postgres.Batch, o *orders.Order) {
	release := map[string]int64{}
	for _, it := range o.Items {
		release[it.SKU] += int64(it.Quantity)
	}
	skus, qtys := sortedSKUs(release)
	b.Queue(`SELECT release_stock(?::text[], ?::bigint[])`, []any{postgres.TextArray(skus), postgres.IntArray(qtys)}, nil)
}
