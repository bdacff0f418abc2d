package checkout

import (
	"context"
	"errors"
	"fmt"
	"sort"
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
// them: prices and currencies do not change under a checkout, and stock is
// checked by reserveStock. Unknown skus are absent from the map.
func loadProducts(ctx context.Context, tx *gorm.DB, skus []string) (map[string]Product, error) {
	var ps []Product
	if err := tx.WithContext(ctx).Where("sku IN ?", skus).Find(&ps).Error; err != nil {
		return nil, fmt.Errorf("load products: %w", err)
	}
	m := make(map[string]Product, len(ps))
	for _, p := range ps {
		m[p.SKU] = p
	}
	return m, nil
}

// reserveStock takes want[sku] units of each product, in sku order so that
// concurrent checkouts lock rows in the same order and cannot deadlock. It
// reports false, having changed nothing that the caller's rollback to a
// savepoint would not undo, when any product has too few units.
func reserveStock(ctx context.Context, tx *gorm.DB, want map[string]int64) (bool, error) {
	skus := make([]string, 0, len(want))
	for sku := range want {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for _, sku := range skus {
		res := tx.WithContext(ctx).Exec(`UPDATE products SET stock = stock - ? WHERE sku = ? AND stock >= ?`, want[sku], sku, want[sku])
		if res.Error != nil {
			return false, fmt.Errorf("reserve stock of %s: %w", sku, res.Error)
		}
		if res.RowsAffected == 0 {
			return false, nil
		}
	}
	return true, nil
}

// adjustStock adds delta[sku] to each product's stock (negative reserves).
func adjustStock(ctx context.Context, tx *gorm.DB, delta map[string]int64) error {
	skus := make([]string, 0, len(delta))
	for sku := range delta {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for _, sku := range skus {
		res := tx.WithContext(ctx).Exec(`UPDATE products SET stock = stock + ? WHERE sku = ?`, delta[sku], sku)
		if res.Error != nil {
			return fmt.Errorf("adjust stock of %s: %w", sku, res.Error)
		}
	}
	return nil
}

func insertOrder(ctx context.Context, tx *gorm.DB, o *Order) error {
	row := orderRow{
		ID: o.ID, TenantID: o.tenantID, Status: o.Status, Email: o.Email, Currency: o.Currency,
		AmountTotal: o.AmountTotal, PaymentMethod: o.paymentMethod, CreatedAt: o.CreatedAt, UpdatedAt: o.CreatedAt,
	}
	for i, it := range o.Items {
		row.Items = append(row.Items, itemRow{OrderID: o.ID, Line: i + 1, SKU: it.SKU,
			Quantity: it.Quantity, UnitAmount: it.UnitAmount, Amount: it.Amount})
	}
	if err := tx.WithContext(ctx).Create(&row).Error; err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	return nil
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
