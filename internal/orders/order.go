// Package orders owns the order lifecycle and the orders and order_items
// tables: every status as a typed constant and the allowed transitions as
// one table (status.go), the one function that changes an order's status
// inside the caller's transaction (Apply), and the reads and writes of
// order rows the checkout saga, refunds, the reconciler and the
// notification worker need, each inside the caller's transaction or
// handle. No other package names these tables.
package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/onceonly/checkout/internal/stripeintent"
)

// ErrNotFound is returned for an order that does not exist (or is another
// tenant's, so ids cannot be probed across tenants).
var ErrNotFound = errors.New("order not found")

// Order is an order as the API returns it and as events carry it. The
// fields without a JSON name are the service's own.
type Order struct {
	ID          string      `json:"id"`
	Status      Status      `json:"status"`
	Email       string      `json:"email"`
	Currency    string      `json:"currency"`
	AmountTotal int64       `json:"amount_total"`
	Items       []OrderItem `json:"items"`
	Payment     Payment     `json:"payment"`
	CreatedAt   time.Time   `json:"created_at"`

	TenantID      string `json:"-"`
	PaymentMethod string `json:"-"`
	// ReturnURL is the checkout's return_url, sent with every confirm of
	// its PaymentIntent ("" for none).
	ReturnURL string `json:"-"`
	// FailureCode is why a payment_failed order failed: card_declined,
	// payment_rejected, payment_action_timeout, payment_canceled (or
	// canceled, for a canceled order).
	FailureCode string `json:"-"`
	// DeclineCode is Stripe's decline_code (or error code) of a decline.
	DeclineCode string `json:"-"`
	// RequiresActionAt is when the order entered requires_action.
	RequiresActionAt *time.Time `json:"-"`
	// UnknownSince is when an unanswered or indeterminate step was first
	// recorded and not yet reconciled.
	UnknownSince *time.Time `json:"-"`
}

// OrderItem is one line of an order. Amount = Quantity * UnitAmount, in the
// currency's minor unit.
type OrderItem struct {
	SKU        string `json:"sku"`
	Quantity   int    `json:"quantity"`
	UnitAmount int64  `json:"unit_amount"`
	Amount     int64  `json:"amount"`
}

// Payment is the order's payment. PaymentIntentID and Status are empty until
// the PaymentIntent has been created; NextAction and ClientSecret are set
// only while the order is requires_action: Stripe's next_action as it sent
// it, and the client_secret the customer's browser needs for it (Stripe.js
// handleNextAction, https://docs.stripe.com/payments/3d-secure).
type Payment struct {
	Provider        string              `json:"provider"`
	PaymentIntentID string              `json:"payment_intent_id,omitempty"`
	Status          stripeintent.Status `json:"status,omitempty"`
	NextAction      json.RawMessage     `json:"next_action,omitempty"`
	ClientSecret    string              `json:"client_secret,omitempty"`
}

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
		Status:        Status(r.Status),
		Email:         r.Email,
		Currency:      r.Currency,
		AmountTotal:   r.AmountTotal,
		Payment:       Payment{Provider: "stripe"},
		CreatedAt:     r.CreatedAt.UTC(),
		TenantID:      r.TenantID,
		PaymentMethod: r.PaymentMethod,
	}
	if r.ReturnURL != nil {
		o.ReturnURL = *r.ReturnURL
	}
	if r.PaymentIntentID != nil {
		o.Payment.PaymentIntentID = *r.PaymentIntentID
	}
	if r.PaymentStatus != nil {
		o.Payment.Status = stripeintent.Status(*r.PaymentStatus)
	}
	if o.Status == RequiresAction {
		// Shown only while the customer has something to do.
		if len(r.PaymentNextAction) > 0 {
			o.Payment.NextAction = json.RawMessage(r.PaymentNextAction)
		}
		if r.PaymentClientSecret != nil {
			o.Payment.ClientSecret = *r.PaymentClientSecret
		}
	}
	if r.PaymentFailureCode != nil {
		o.FailureCode = *r.PaymentFailureCode
	}
	if r.PaymentDeclineCode != nil {
		o.DeclineCode = *r.PaymentDeclineCode
	}
	if r.RequiresActionAt != nil {
		t := r.RequiresActionAt.UTC()
		o.RequiresActionAt = &t
	}
	if r.PaymentUnknownSince != nil {
		t := r.PaymentUnknownSince.UTC()
		o.UnknownSince = &t
	}
	sort.Slice(r.Items, func(i, j int) bool { return r.Items[i].Line < r.Items[j].Line })
	o.Items = make([]OrderItem, len(r.Items))
	for i, it := range r.Items {
		o.Items[i] = OrderItem{SKU: it.SKU, Quantity: it.Quantity, UnitAmount: it.UnitAmount, Amount: it.Amount}
	}
	return o
}

// Load returns tenant's order id with its items, through db (a handle or
// the caller's transaction), or ErrNotFound (also for another tenant's
// order).
func Load(ctx context.Context, db *gorm.DB, tenantID, id string) (*Order, error) {
	var row orderRow
	err := db.WithContext(ctx).Preload("Items").Where("id = ? AND tenant_id = ?", id, tenantID).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("load order %s: %w", id, err)
	}
	return row.order(), nil
}

// Lock locks the row of tenant's order id until tx ends, without reading
// it, or returns ErrNotFound. Whoever changes an order's payment from
// outside the saga's own steps (a cancellation, a stray payment's refund)
// takes it first, so that concurrent ones take turns.
func Lock(ctx context.Context, tx *gorm.DB, tenantID, id string) error {
	var ids []string
	q := tx.WithContext(ctx).Model(&orderRow{}).Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id)
	if tenantID != "" {
		q = q.Where("tenant_id = ?", tenantID)
	}
	if err := q.Pluck("id", &ids).Error; err != nil {
		return fmt.Errorf("lock order %s: %w", id, err)
	}
	if len(ids) == 0 {
		return ErrNotFound
	}
	return nil
}

// Recipient is what an email about an order says to whom: the order's
// address, its total in the currency's minor units, and the currency.
type Recipient struct {
	Email       string
	AmountTotal int64
	Currency    string
}

// RecipientOf returns the Recipient of order id, through tx, or
// ErrNotFound.
func RecipientOf(ctx context.Context, tx *gorm.DB, id string) (Recipient, error) {
	var rs []Recipient
	if err := tx.WithContext(ctx).Model(&orderRow{}).Where("id = ?", id).
		Select("email, amount_total, currency").Scan(&rs).Error; err != nil {
		return Recipient{}, fmt.Errorf("load the recipient of order %s: %w", id, err)
	}
	if len(rs) == 0 {
		return Recipient{}, ErrNotFound
	}
	return rs[0], nil
}
