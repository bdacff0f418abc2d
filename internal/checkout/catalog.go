package checkout

import (
	"context"
	"sync"

	"gorm.io/gorm"
)

// catalog keeps the prices and currencies of the products checkouts have
// asked for, never their stock, so that a first execution need not read
// them before its statement. It is a cache that cannot serve a stale price:
// the statement that writes the order checks, in its own snapshot, that
// every product still has the price and currency the order was built with,
// and writes nothing when one changed (the caller forgets the skus and the
// general path, which reads the catalog in its transaction, runs the
// request). Only skus the database knows are kept, so its size is bounded
// by the catalog's. The zero value is ready to use.
type catalog struct {
	mu       sync.RWMutex
	products map[string]Product
}

// products returns the products of skus, from memory when all are there,
// else read from db (and kept); unknown skus are absent from the map.
func (c *catalog) lookup(ctx context.Context, db *gorm.DB, skus []string) (map[string]Product, error) {
	c.mu.RLock()
	m := make(map[string]Product, len(skus))
	for _, sku := range skus {
		if p, ok := c.products[sku]; ok {
			m[sku] = p
		}
	}
	c.mu.RUnlock()
	if len(m) == len(skus) {
		return m, nil
	}
	m, err := loadProducts(ctx, db, skus)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.products == nil {
		c.products = map[string]Product{}
	}
	for sku, p := range m {
		c.products[sku] = p
	}
	return m, nil
}

// forget drops skus, whose prices or currencies were found changed.
func (c *catalog) forget(skus []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sku := range skus {
		delete(c.products, sku)
	}
}
