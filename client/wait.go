package client

import (
	"context"
	"fmt"

	"github.com/cenkalti/backoff/v5"
)

// Settled reports whether an order in status s has its purchase's
// outcome: paid, payment_failed or canceled, or refunded in part or in
// full afterwards. pending_payment, requires_action and payment_unknown
// are on the way to one of them (CONTRACT.md, "Order statuses").
func (s OrderStatus) Settled() bool {
	switch s {
	case OrderPaid, OrderPaymentFailed, OrderCanceled, OrderPartiallyRefunded, OrderRefunded:
		return true
	}
	return false
}

// WaitOrder follows order id (GetOrder, GET /v1/orders/{id}) until its
// status is Settled, and returns it: the way to follow a 202 checkout
// (requires_action), which settles when the customer's 3D Secure
// challenge ends (a webhook, or the reconciler), or fails after
// PAYMENT_ACTION_TIMEOUT when the customer never comes back, and a
// payment_unknown order, which settles when Stripe answers.
//
// It polls with exponential backoff (cenkalti/backoff/v5, with jitter)
// from the client's RetryPolicy.BaseDelay up to RetryPolicy.MaxDelay
// between reads, waiting through RetryPolicy.Sleep; each read retries its
// transient answers as GetOrder does. It returns when ctx ends (the last
// order read, if any, and an error that wraps ctx.Err()) or when a read
// fails finally (the *Error, e.g. ErrNotFound). Bound ctx: an order whose
// customer walks away settles only after PAYMENT_ACTION_TIMEOUT (default
// 1h).
func (c *Client) WaitOrder(ctx context.Context, id string) (*OrderResult, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = c.retry.BaseDelay
	b.MaxInterval = c.retry.MaxDelay
	var last *OrderResult
	for {
		r, err := c.GetOrder(ctx, id)
		if err != nil {
			if last != nil && ctx.Err() != nil {
				return last, fmt.Errorf("client: order %s still %s: %w", id, last.Order.Status, ctx.Err())
			}
			return last, err
		}
		last = r
		if r.Order.Status.Settled() {
			return r, nil
		}
		if err := c.retry.Sleep(ctx, b.NextBackOff()); err != nil {
			return last, fmt.Errorf("client: order %s still %s: %w", id, last.Order.Status, err)
		}
	}
}
