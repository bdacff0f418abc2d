package api

import (
	"context"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/refunds"
)

// StrayRefunds adapts Stripe's Refund API as the refunds package calls it
// (refunds.Stripe: *payments.Client, or a test's fake) to what the checkout
// saga needs to return a stray payment (checkout.RefundAPI), so that
// checkout does not import refunds. nil gives nil: stray payments are then
// only counted and logged.
func StrayRefunds(r refunds.Stripe) checkout.RefundAPI {
	if r == nil {
		return nil
	}
	return strayRefunds{r}
}

// strayRefunds is StrayRefunds' adapter.
type strayRefunds struct{ stripe refunds.Stripe }

// ListRefunds is refunds.Stripe.ListRefunds.
func (s strayRefunds) ListRefunds(ctx context.Context, paymentIntentID string) ([]checkout.RefundState, error) {
	list, err := s.stripe.ListRefunds(ctx, paymentIntentID)
	if err != nil {
		return nil, err
	}
	out := make([]checkout.RefundState, len(list))
	for i, r := range list {
		out[i] = refundState(r)
	}
	return out, nil
}

// CreateRefund is refunds.Stripe.CreateRefund.
func (s strayRefunds) CreateRefund(ctx context.Context, p checkout.RefundParams) (checkout.RefundState, error) {
	r, err := s.stripe.CreateRefund(ctx, refunds.CreateParams{IdempotencyKey: p.IdempotencyKey,
		PaymentIntentID: p.PaymentIntentID, Amount: p.Amount, Reason: p.Reason, OrderID: p.OrderID, TenantID: p.TenantID})
	if err != nil {
		return checkout.RefundState{}, err
	}
	return refundState(r), nil
}

func refundState(r refunds.StripeRefund) checkout.RefundState {
	return checkout.RefundState{ID: r.ID, Amount: r.Amount, Status: r.Status, Metadata: r.Metadata}
}
