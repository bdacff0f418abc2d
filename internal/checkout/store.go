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

// adjustStock gives delta[sku] units of each product back (a declined
// payment's reservation).
func adjustStock(ctx context.Context, tx *gorm.DB, delta map[string]int64) error {
	skus, qtys := sortedSKUs(delta)
	if err := tx.WithContext(ctx).Exec(`SELECT release_stock(?::text[], ?::bigint[])`,
		postgres.TextArray(skus), postgres.IntArray(qtys)).Error; err != nil {
		return fmt.Errorf("release stock: %w", err)
	}
	return nil
}

// reserveStock takes want's units from the stock inside tx and reports
// whether there were enough (when not, it took nothing).
func reserveStock(ctx context.Context, tx *gorm.DB, want map[string]int64) (bool, error) {
	skus, qtys := sortedSKUs(want)
	var ok bool
	if err := tx.WithContext(ctx).Raw(`SELECT reserve_stock(?::text[], ?::bigint[])`,
		postgres.TextArray(skus), postgres.IntArray(qtys)).Row().Scan(&ok); err != nil {
		return false, fmt.Errorf("reserve stock: %w", err)
	}
	return ok, nil
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

// releaseStock gives an order's reserved units back.
func releaseStock(ctx context.Context, tx *gorm.DB, o *orders.Order) error {
	release := map[string]int64{}
	for _, it := range o.Items {
		release[it.SKU] += int64(it.Quantity)
	}
	return adjustStock(ctx, tx, release)
}
