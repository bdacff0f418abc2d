package checkout

import "context"

// RefundAPI is what returning a stray payment (SettleStrayPayment) needs
// of Stripe's Refund API (https://docs.stripe.com/api/refunds): ListRefunds
// lists every refund of a PaymentIntent (strongly consistent, unlike
// search); CreateRefund sends one with p.IdempotencyKey as Stripe's
// Idempotency-Key and returns the refund Stripe created, whatever its
// status, or an error that stripestep.OutcomeOf classifies.
//
// checkout names only what it reads, so that it does not import refunds:
// internal/api.StrayRefunds adapts refunds.Stripe (*payments.Client) to it.
type RefundAPI interface {
	ListRefunds(ctx context.Context, paymentIntentID string) ([]RefundState, error)
	CreateRefund(ctx context.Context, p RefundParams) (RefundState, error)
}

// RefundState is what a stray payment's return reads of a refund at
// Stripe.
type RefundState struct {
	// ID is Stripe's id, "re_…".
	ID string
	// Amount in minor units.
	Amount int64
	// Status is pending, requires_action, succeeded, failed or canceled.
	Status string
	// Metadata holds refund_id, order_id and tenant_id for refunds the
	// service made (refund_id only for those the refunds package made).
	Metadata map[string]string
}

// RefundParams is one POST /v1/refunds of a stray payment.
type RefundParams struct {
	// IdempotencyKey is the attempt's key (StrayRefundKey).
	IdempotencyKey  string
	PaymentIntentID string
	// Amount in minor units.
	Amount int64
	// Reason is Stripe's reason (strayRefundReason).
	Reason string
	// OrderID and TenantID go into the refund's metadata.
	OrderID, TenantID string
}
