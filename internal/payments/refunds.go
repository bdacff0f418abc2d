package payments

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/refund"

	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/stripestep"
)

var (
	_ refunds.Stripe        = (*Client)(nil)
	_ refunds.OutsideStripe = (*Client)(nil)
)

// Ops of the refund calls, in the op label of checkout_stripe_calls_total.
const (
	opRefundCreate   op = "refund.create"
	opRefundRetrieve op = "refund.retrieve"
	opRefundList     op = "refund.list"
)

func (c *Client) refundClient() refund.Client { return refund.Client{B: c.pi.B, Key: c.pi.Key} }

// CreateRefund creates a refund (POST /v1/refunds with payment_intent,
// amount, reason and metadata refund_id, order_id, tenant_id) with
// p.IdempotencyKey as Stripe's Idempotency-Key
// (https://docs.stripe.com/api/refunds/create).
//
// Answers Stripe does not store under the key (a network error or timeout,
// 409 idempotency_key_in_use or lock_timeout, 429, 503) are retried with the
// same key and parameters until Config.MaxElapsed. It returns the refund
// Stripe answered with, whatever its status; a *checkout.PaymentRefusal for
// a 4xx (nothing was created); an error wrapping ErrIndeterminate for a
// 500, which Stripe stores under the key, so it is not resent
// (https://docs.stripe.com/api/idempotent_requests); and an error wrapping
// ErrUnavailable when the retries ran out without an answer, in which case
// the refund may have been created too, and resending the key is safe
// (stripestep.OutcomeOf classifies them all).
func (c *Client) CreateRefund(ctx context.Context, p refunds.CreateParams) (refunds.StripeRefund, error) {
	if strings.TrimSpace(p.IdempotencyKey) == "" {
		return refunds.StripeRefund{}, fmt.Errorf("refund %s: %w: %w", p.RefundID, stripestep.ErrRejected, ErrNoIdempotencyKey)
	}
	rc := c.refundClient()
	return callT(ctx, c, opRefundCreate, p.IdempotencyKey, func(actx context.Context) (refunds.StripeRefund, error) {
		params := &stripe.RefundParams{
			PaymentIntent: stripe.String(p.PaymentIntentID),
			Amount:        stripe.Int64(p.Amount),
		}
		if p.Reason != "" {
			params.Reason = stripe.String(p.Reason)
		}
		params.Context = actx
		params.SetIdempotencyKey(p.IdempotencyKey)
		params.AddMetadata("refund_id", p.RefundID)
		params.AddMetadata("order_id", p.OrderID)
		params.AddMetadata("tenant_id", p.TenantID)
		r, err := rc.New(params)
		if err != nil {
			return refunds.StripeRefund{}, err
		}
		return refundStateOf(r), nil
	})
}

// GetRefund retrieves a refund by Stripe id
// (https://docs.stripe.com/api/refunds/retrieve), retrying transient
// failures (a read's 5xx included). A 4xx (no such refund) is a
// *checkout.PaymentRefusal.
func (c *Client) GetRefund(ctx context.Context, id string) (refunds.StripeRefund, error) {
	rc := c.refundClient()
	return callT(ctx, c, opRefundRetrieve, "", func(actx context.Context) (refunds.StripeRefund, error) {
		params := &stripe.RefundParams{}
		params.Context = actx
		r, err := rc.Get(id, params)
		if err != nil {
			return refunds.StripeRefund{}, err
		}
		return refundStateOf(r), nil
	})
}

// ListRefunds lists every refund of a PaymentIntent, newest first, paging
// through all of them (https://docs.stripe.com/api/refunds/list). Unlike
// search, the list is strongly consistent: a refund Stripe created is in
// it. Transient failures are retried.
func (c *Client) ListRefunds(ctx context.Context, paymentIntentID string) ([]refunds.StripeRefund, error) {
	return c.listRefunds(ctx, &stripe.RefundListParams{PaymentIntent: stripe.String(paymentIntentID)})
}

// ListRefundsSince lists every refund of the account created at or after
// since (Stripe's clock, whole seconds), newest first, paging through all
// of them (https://docs.stripe.com/api/refunds/list, created[gte]); the
// list is strongly consistent. Transient failures are retried.
func (c *Client) ListRefundsSince(ctx context.Context, since time.Time) ([]refunds.StripeRefund, error) {
	return c.listRefunds(ctx, &stripe.RefundListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: since.Unix()}})
}

// listRefunds lists every refund that params' filter selects, 100 a page,
// each try of the call starting again from the first page.
func (c *Client) listRefunds(ctx context.Context, filter *stripe.RefundListParams) ([]refunds.StripeRefund, error) {
	rc := c.refundClient()
	return callT(ctx, c, opRefundList, "", func(actx context.Context) ([]refunds.StripeRefund, error) {
		params := *filter
		params.Context = actx
		params.Limit = stripe.Int64(100)
		var out []refunds.StripeRefund
		it := rc.List(&params)
		for it.Next() {
			out = append(out, refundStateOf(it.Refund()))
		}
		return out, it.Err()
	})
}

// IntentOrder returns the order and tenant PaymentIntent id names in its
// metadata (order_id, tenant_id; "" when it names none), retrieving it by
// id (strongly consistent).
func (c *Client) IntentOrder(ctx context.Context, id string) (orderID, tenantID string, err error) {
	pi, err := c.RetrievePaymentIntent(ctx, id)
	if err != nil {
		return "", "", err
	}
	return pi.Metadata["order_id"], pi.Metadata["tenant_id"], nil
}

func refundStateOf(r *stripe.Refund) refunds.StripeRefund {
	st := refunds.StripeRefund{
		ID: r.ID, Amount: r.Amount, Currency: string(r.Currency), Status: string(r.Status),
		FailureReason: string(r.FailureReason), Metadata: r.Metadata, Reason: string(r.Reason),
		Created: r.Created,
	}
	if r.PaymentIntent != nil {
		st.PaymentIntentID = r.PaymentIntent.ID
	}
	return st
}
