package api

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/tracing"
	"github.com/onceonly/checkout/internal/webhooks"
)

// webhookOrders adapts the checkout saga to what the webhook handler needs
// (webhooks.Orders): the order's status, and the saga's monotonic apply of
// a PaymentIntent's state, with the handler's inbox record in its
// transaction.
type webhookOrders struct{ svc *checkout.Service }

var _ webhooks.Orders = webhookOrders{}

// OrderStatus returns the status of tenant's order id, or an error wrapping
// webhooks.ErrNotOurs.
func (o webhookOrders) OrderStatus(ctx context.Context, tenantID, orderID string) (orders.Status, error) {
	v, err := o.svc.Order(ctx, tenantID, orderID)
	if errors.Is(err, checkout.ErrOrderNotFound) {
		return "", fmt.Errorf("order %s of %s: %w", orderID, tenantID, webhooks.ErrNotOurs)
	}
	if err != nil {
		return "", err
	}
	return v.Status, nil
}

// ApplyPaymentIntent is checkout.Service.ApplyPaymentIntent, its errors
// in the handler's terms. It links the webhook's span (a trace of its own:
// Stripe's event is its cause) to the order's checkout trace.
func (o webhookOrders) ApplyPaymentIntent(ctx context.Context, pi webhooks.PaymentIntent, record func(tx *gorm.DB) (bool, error)) (bool, error) {
	tp, err := outbox.TraceParentOf(ctx, o.svc.DB, pi.OrderID)
	if err != nil {
		return false, err
	}
	tracing.LinkTo(ctx, tp)
	changed, err := o.svc.ApplyPaymentIntent(ctx, toState(pi), record)
	switch {
	case errors.Is(err, checkout.ErrOrderNotFound):
		return false, fmt.Errorf("order %s of %s: %w", pi.OrderID, pi.TenantID, webhooks.ErrNotOurs)
	case errors.Is(err, checkout.ErrStripeStep):
		return false, fmt.Errorf("%w: %w", webhooks.ErrStripe, err)
	}
	return changed, err
}

// SettleStrayPayment is checkout.Service.SettleStrayPayment.
func (o webhookOrders) SettleStrayPayment(ctx context.Context, pi webhooks.PaymentIntent) error {
	return o.svc.SettleStrayPayment(ctx, toState(pi))
}

// webhookStripe retrieves PaymentIntents with the saga's Stripe client.
type webhookStripe struct{ p checkout.PaymentProvider }

var _ webhooks.PaymentIntents = webhookStripe{}

// RetrievePaymentIntent is GET /v1/payment_intents/{id}.
func (s webhookStripe) RetrievePaymentIntent(ctx context.Context, id string) (webhooks.PaymentIntent, error) {
	st, err := s.p.RetrievePaymentIntent(ctx, id)
	if err != nil {
		return webhooks.PaymentIntent{}, err
	}
	return fromState(st), nil
}

func toState(pi webhooks.PaymentIntent) checkout.PaymentIntentState {
	return checkout.PaymentIntentState{
		ID: pi.ID, Status: pi.Status, Amount: pi.Amount, Currency: pi.Currency,
		Metadata:      map[string]string{"order_id": pi.OrderID, "tenant_id": pi.TenantID},
		NextAction:    pi.NextAction,
		ClientSecret:  pi.ClientSecret,
		LastErrorCode: pi.LastErrorCode, LastDeclineCode: pi.LastDeclineCode,
		CancellationReason: pi.CancellationReason,
	}
}

func fromState(st checkout.PaymentIntentState) webhooks.PaymentIntent {
	return webhooks.PaymentIntent{
		ID: st.ID, Status: st.Status, Amount: st.Amount, Currency: st.Currency,
		OrderID: st.Metadata["order_id"], TenantID: st.Metadata["tenant_id"],
		LastErrorCode: st.LastErrorCode, LastDeclineCode: st.LastDeclineCode,
		CancellationReason: st.CancellationReason,
		NextAction:         st.NextAction, ClientSecret: st.ClientSecret,
	}
}

// webhookRefunds adapts the refund saga to what the webhook handler needs
// (webhooks.Refunds): refunds.Service.ApplyRefund inside the handler's
// transaction, only forward, and the Stripe client's list of a
// PaymentIntent's refunds.
type webhookRefunds struct{ svc *refunds.Service }

var _ webhooks.Refunds = webhookRefunds{}

// ApplyRefund applies r with refunds.Service.ApplyRefund; a refund that is
// none of ours (refunds.ErrNotOurs) is reported as webhooks.ErrNotOurs, so
// the event is answered 200 instead of being resent for days.
func (w webhookRefunds) ApplyRefund(ctx context.Context, tx *gorm.DB, r webhooks.Refund) (bool, error) {
	md := map[string]string{}
	for k, v := range map[string]string{"order_id": r.OrderID, "tenant_id": r.TenantID, "refund_id": r.RefundID} {
		if v != "" {
			md[k] = v
		}
	}
	changed, err := w.svc.ApplyRefund(ctx, tx, refunds.StripeRefund{
		ID: r.ID, PaymentIntentID: r.PaymentIntentID, Amount: r.Amount, Currency: r.Currency,
		Status: r.Status, FailureReason: r.FailureReason, Metadata: md, Reason: r.Reason,
		OrderID: r.IntentOrderID, TenantID: r.IntentTenantID,
	})
	if errors.Is(err, refunds.ErrNotOurs) {
		return false, fmt.Errorf("%w: %w", webhooks.ErrNotOurs, err)
	}
	return changed, err
}

// RefundsOf lists pi's refunds at Stripe, newest first
// (refunds.Stripe.ListRefunds, every page); an error when Stripe did not
// answer.
func (w webhookRefunds) RefundsOf(ctx context.Context, pi string) ([]webhooks.Refund, error) {
	list, err := w.svc.Stripe.ListRefunds(ctx, pi)
	if err != nil {
		return nil, err
	}
	out := make([]webhooks.Refund, len(list))
	for i, st := range list {
		out[i] = webhooks.Refund{ID: st.ID, Status: st.Status, Amount: st.Amount, Currency: st.Currency,
			PaymentIntentID: st.PaymentIntentID, FailureReason: st.FailureReason, Reason: st.Reason}
		out[i].SetMetadata(st.Metadata)
	}
	return out, nil
}
