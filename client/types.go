package client

import (
	"encoding/json"
	"time"
)

// CheckoutRequest is the body of POST /v1/checkouts (schema
// CheckoutRequest). Its canonical JSON (RFC 8785) is part of the key's
// fingerprint: the same key with another request is 422
// idempotency_key_reused.
type CheckoutRequest struct {
	// Email is the buyer's address, where the paid and refund emails go.
	Email string `json:"email"`
	// Items are the lines bought: 1 to 50, each a known SKU and a quantity
	// of 1 to 100.
	Items []Item `json:"items"`
	// PaymentMethod is a Stripe payment method, e.g. "pm_card_visa";
	// "pm_card_authenticationRequired" needs 3D Secure (a 202).
	PaymentMethod string `json:"payment_method"`
	// ReturnURL (optional, an absolute http or https URL) is passed to
	// Stripe's confirm: a card that needs 3D Secure then answers with
	// next_action.type "redirect_to_url", and the customer comes back to
	// ReturnURL with payment_intent in the query (CONTRACT.md, (v3) Clients).
	ReturnURL string `json:"return_url,omitempty"`
}

// Item is one line of a CheckoutRequest.
type Item struct {
	// SKU names a product of ListProducts, e.g. "sku_tee".
	SKU string `json:"sku"`
	// Quantity is 1 to 100.
	Quantity int `json:"quantity"`
}

// OrderStatus is the status of an order. An order only moves forward:
// pending_payment -> requires_action -> paid | payment_failed | canceled;
// pending_payment -> payment_unknown -> paid | payment_failed; paid ->
// partially_refunded -> refunded.
type OrderStatus string

// The order statuses of CONTRACT.md and schema Order.
const (
	// OrderPendingPayment: created, its payment not settled yet.
	OrderPendingPayment OrderStatus = "pending_payment"
	// OrderRequiresAction: the customer must authenticate (3D Secure); see
	// Payment.NextAction.
	OrderRequiresAction OrderStatus = "requires_action"
	// OrderPaymentUnknown: Stripe's outcome stayed unknown past
	// PAYMENT_UNKNOWN_AFTER; the service still reconciles it.
	OrderPaymentUnknown OrderStatus = "payment_unknown"
	// OrderPaid: one PaymentIntent succeeded.
	OrderPaid OrderStatus = "paid"
	// OrderPaymentFailed: declined, rejected, or authentication failed or
	// timed out; its stock is released.
	OrderPaymentFailed OrderStatus = "payment_failed"
	// OrderCanceled: canceled while in requires_action (CancelOrder).
	OrderCanceled OrderStatus = "canceled"
	// OrderPartiallyRefunded: paid, with succeeded refunds of part of it.
	OrderPartiallyRefunded OrderStatus = "partially_refunded"
	// OrderRefunded: paid, then refunded in full.
	OrderRefunded OrderStatus = "refunded"
)

// Order is the service's order (schema Order). The checkout's 201 and 202,
// the cancellation's 200 and GET /v1/orders/{id} all return it; the last
// also fills AmountRefunded, Refunds and Notifications.
type Order struct {
	// ID is "ord_" and 32 hex digits.
	ID string `json:"id"`
	// Status is where the order is in its lifecycle.
	Status OrderStatus `json:"status"`
	// Email is the buyer's address.
	Email string `json:"email"`
	// Currency is an ISO 4217 code in lower case, e.g. "usd".
	Currency string `json:"currency"`
	// AmountTotal is the sum of the items' amounts, in minor units.
	AmountTotal int64 `json:"amount_total"`
	// Items are the lines with their prices at the time of the order.
	Items []OrderItem `json:"items"`
	// Payment is the order's payment at Stripe.
	Payment Payment `json:"payment"`
	// CreatedAt is when the order was created (RFC 3339 in JSON).
	CreatedAt time.Time `json:"created_at"`
	// AmountRefunded is the sum of the succeeded refunds, in minor units
	// (GET /v1/orders/{id}).
	AmountRefunded int64 `json:"amount_refunded,omitempty"`
	// Refunds are the order's refunds, oldest first (GET /v1/orders/{id}).
	Refunds []Refund `json:"refunds,omitempty"`
	// Notifications are the emails about the order (GET /v1/orders/{id}).
	Notifications []Notification `json:"notifications,omitempty"`
}

// OrderItem is one line of an Order.
type OrderItem struct {
	// SKU names the product.
	SKU string `json:"sku"`
	// Quantity is how many were bought.
	Quantity int `json:"quantity"`
	// UnitAmount is the product's price when ordered, in minor units.
	UnitAmount int64 `json:"unit_amount"`
	// Amount is Quantity times UnitAmount, in minor units.
	Amount int64 `json:"amount"`
}

// Payment is an order's payment (schema Order.payment).
type Payment struct {
	// Provider is "stripe".
	Provider string `json:"provider"`
	// PaymentIntentID is Stripe's PaymentIntent, "pi_…", once created.
	PaymentIntentID string `json:"payment_intent_id,omitempty"`
	// Status is the PaymentIntent's status at Stripe, e.g. "succeeded".
	Status string `json:"status,omitempty"`
	// NextAction is Stripe's next_action, only while the order is
	// requires_action.
	NextAction *NextAction `json:"next_action,omitempty"`
	// ClientSecret is the PaymentIntent's client_secret for Stripe.js
	// handleNextAction, only while the order is requires_action. It lets a
	// browser complete the payment: hand it to the buyer only.
	ClientSecret string `json:"client_secret,omitempty"`
}

// NextAction is Stripe's next_action of a PaymentIntent that needs the
// customer (docs.stripe.com/api/payment_intents/object#payment_intent_object-next_action).
type NextAction struct {
	// Type is "redirect_to_url" (a CheckoutRequest.ReturnURL was given) or
	// "use_stripe_sdk".
	Type string `json:"type"`
	// RedirectToURL is set when Type is "redirect_to_url".
	RedirectToURL *RedirectToURL `json:"redirect_to_url,omitempty"`
	// Raw is next_action as Stripe sent it, for the fields not modelled
	// here (use_stripe_sdk's are Stripe.js's business).
	Raw json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes next_action and keeps it whole in Raw.
func (n *NextAction) UnmarshalJSON(b []byte) error {
	type plain NextAction
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*n = NextAction(p)
	n.Raw = append(json.RawMessage(nil), b...)
	return nil
}

// RedirectToURL is where to send the customer for 3D Secure.
type RedirectToURL struct {
	// URL is the challenge page (the emulator serves one).
	URL string `json:"url"`
	// ReturnURL is the CheckoutRequest.ReturnURL Stripe sends the
	// customer back to, with payment_intent in the query.
	ReturnURL string `json:"return_url"`
}

// RefundRequest is the body of POST /v1/orders/{id}/refunds (schema
// RefundRequest); the zero value refunds all that is left.
type RefundRequest struct {
	// Amount is in minor units, at least 1; 0 (absent) means all that is
	// left of what was paid.
	Amount int64 `json:"amount,omitempty"`
	// Reason is one of RefundReason's constants, or "" for none.
	Reason RefundReason `json:"reason,omitempty"`
}

// RefundReason is Stripe's reason for a refund.
type RefundReason string

// The refund reasons Stripe accepts (schema RefundRequest.reason).
const (
	ReasonRequestedByCustomer RefundReason = "requested_by_customer"
	ReasonDuplicate           RefundReason = "duplicate"
	ReasonFraudulent          RefundReason = "fraudulent"
)

// RefundStatus is the status of a refund.
type RefundStatus string

// The refund statuses (schema Refund.status, and CONTRACT.md v3). A pending
// refund counts against what is left to refund until it settles.
const (
	RefundPending   RefundStatus = "pending"
	RefundSucceeded RefundStatus = "succeeded"
	RefundFailed    RefundStatus = "failed"
	// RefundRequiresAttention: Stripe has not settled it within
	// REFUND_RETRY_AFTER; it is never sent again under a new key, and an
	// operator is alerted (CONTRACT.md v3).
	RefundRequiresAttention RefundStatus = "requires_attention"
)

// Refund is a refund of an order (schema Refund).
type Refund struct {
	// ID is "rf_" and 32 hex digits.
	ID string `json:"id"`
	// OrderID is the refunded order.
	OrderID string `json:"order_id"`
	// Amount is in minor units.
	Amount int64 `json:"amount"`
	// Currency is the order's.
	Currency string `json:"currency"`
	// Reason is the RefundRequest's, "" when none was given (JSON null).
	Reason RefundReason `json:"reason"`
	// Status is where the refund is at Stripe.
	Status RefundStatus `json:"status"`
	// StripeRefundID is Stripe's refund, "re_…", "" until Stripe answered
	// (JSON null).
	StripeRefundID string `json:"stripe_refund_id"`
	// FailureReason is Stripe's failure_reason, or "stripe_rejected", when
	// Status is failed.
	FailureReason string `json:"failure_reason,omitempty"`
	// CreatedAt is when the refund was requested.
	CreatedAt time.Time `json:"created_at"`
}

// Notification is an email about an order (schema Notification).
type Notification struct {
	// Channel is "email".
	Channel string `json:"channel"`
	// Kind is "order_paid" or "order_refunded".
	Kind string `json:"kind"`
	// Status is "pending", "sending", "sent" or "failed".
	Status string `json:"status"`
	// SentAt is when the mail server accepted it, nil until then.
	SentAt *time.Time `json:"sent_at"`
}

// Product is a product of the global catalog (schema Product).
type Product struct {
	// SKU identifies it, e.g. "sku_tee".
	SKU string `json:"sku"`
	// Name is for display.
	Name string `json:"name"`
	// UnitAmount is the price in minor units.
	UnitAmount int64 `json:"unit_amount"`
	// Currency is e.g. "usd".
	Currency string `json:"currency"`
	// Stock is the current stock; a declined payment gives its
	// reservation back.
	Stock int64 `json:"stock"`
}
