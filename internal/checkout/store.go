package checkout

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
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

// lockProducts loads and row-locks the products with the given skus, in sku
// order so that concurrent checkouts lock in the same order and cannot
// deadlock. Unknown skus are absent from the map.
func lockProducts(ctx context.Context, tx *gorm.DB, skus []string) (map[string]Product, error) {
	var ps []Product
	err := tx.WithContext(ctx).Clauses(clause.Locking{Strength: "UPDATE"}).
		Where("sku IN ?", skus).Order("sku").Find(&ps).Error
	if err != nil {
		return nil, fmt.Errorf("lock products: %w", err)
	}
	m := make(map[string]Product, len(ps))
	for _, p := range ps {
		m[p.SKU] = p
	}
	return m, nil
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
