package payments

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/refund"

	"github.com/onceonly/checkout/internal/refunds"
)

var _ refunds.Stripe = (*Client)(nil)

// ErrIndeterminate is wrapped by CreateRefund's error when Stripe answered
// 500: Stripe stores that answer under the idempotency key and replays it
// for as long as it keeps the key (https://docs.stripe.com/api/idempotent_requests:
// "including 500 errors"), so resending with the key cannot succeed, and
// the request may or may not have run, or may be rolled forward later
// (https://docs.stripe.com/error-low-level#server-errors). The caller must
// reconcile (list the PaymentIntent's refunds) before any new attempt.
var ErrIndeterminate = errors.New("stripe outcome indeterminate")

func (c *Client) refundClient() refund.Client { return refund.Client{B: c.pi.B, Key: c.pi.Key} }

// CreateRefund creates a refund (POST /v1/refunds with payment_intent,
// amount, reason and metadata refund_id, order_id, tenant_id) with
// p.IdempotencyKey as Stripe's Idempotency-Key
// (https://docs.stripe.com/api/refunds/create).
//
// Answers that are not stored under the key (a network error or timeout,
// 409 idempotency_key_in_use or lock_timeout, 429, 502, 503, 504) are
// retried with the same key and parameters until Config.MaxElapsed. It
// returns the refund Stripe answered with, whatever its status; an error
// wrapping refunds.ErrRejected for any other 4xx (nothing was created); an
// error wrapping ErrIndeterminate for a 500, which is not retried (see
// ErrIndeterminate); and an error wrapping ErrUnavailable when the retries
// ran out, in which case the refund may have been created too.
func (c *Client) CreateRefund(ctx context.Context, p refunds.CreateParams) (refunds.StripeRefund, error) {
	if strings.TrimSpace(p.IdempotencyKey) == "" {
		return refunds.StripeRefund{}, fmt.Errorf("refund %s: %w: empty idempotency key", p.RefundID, refunds.ErrRejected)
	}
	rc := c.refundClient()
	return retry(ctx, c, "refund "+p.RefundID, true, func(actx context.Context) (refunds.StripeRefund, error) {
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
		return stateOf(r), nil
	})
}

// GetRefund retrieves a refund by Stripe id
// (https://docs.stripe.com/api/refunds/retrieve), retrying transient
// failures. A 4xx (no such refund) wraps refunds.ErrRejected.
func (c *Client) GetRefund(ctx context.Context, id string) (refunds.StripeRefund, error) {
	rc := c.refundClient()
	return retry(ctx, c, "get refund "+id, false, func(actx context.Context) (refunds.StripeRefund, error) {
		params := &stripe.RefundParams{}
		params.Context = actx
		r, err := rc.Get(id, params)
		if err != nil {
			return refunds.StripeRefund{}, err
		}
		return stateOf(r), nil
	})
}

// ListRefunds lists every refund of a PaymentIntent, newest first, paging
// through all of them (https://docs.stripe.com/api/refunds/list), retrying
// transient failures. A GET stores nothing, so a 500 is retried too.
func (c *Client) ListRefunds(ctx context.Context, paymentIntentID string) ([]refunds.StripeRefund, error) {
	rc := c.refundClient()
	return retry(ctx, c, "list refunds of "+paymentIntentID, false, func(actx context.Context) ([]refunds.StripeRefund, error) {
		params := &stripe.RefundListParams{PaymentIntent: stripe.String(paymentIntentID)}
		params.Context = actx
		params.Limit = stripe.Int64(100)
		var out []refunds.StripeRefund
		it := rc.List(params)
		for it.Next() {
			out = append(out, stateOf(it.Refund()))
		}
		return out, it.Err()
	})
}

// retry runs op with a per-attempt timeout and exponential backoff until it
// succeeds, fails for good, or Config.MaxElapsed passes. A 500 ends the
// retries of a POST at once (ErrIndeterminate: Stripe stored it under the
// key); a GET's 500 stores nothing and is retried. Other 4xx than 409 and
// 429 are rejections.
func retry[T any](ctx context.Context, c *Client, what string, post bool, op func(ctx context.Context) (T, error)) (T, error) {
	attempts := 0
	var zero T
	res, err := backoff.Retry(ctx, func() (T, error) {
		attempts++
		actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
		v, err := op(actx)
		if err == nil {
			c.calls.WithLabelValues(string(outcomeSucceeded)).Inc()
			return v, nil
		}
		var se *stripe.Error
		if !errors.As(err, &se) {
			c.calls.WithLabelValues(string(outcomeTransient)).Inc()
			return zero, fmt.Errorf("stripe request: %w", err)
		}
		switch s := se.HTTPStatusCode; {
		case s == http.StatusInternalServerError && post:
			c.calls.WithLabelValues(string(outcomeTransient)).Inc()
			return zero, backoff.Permanent(fmt.Errorf("%w: %w", ErrIndeterminate, stripeError{se}))
		case s >= 500, s == http.StatusTooManyRequests, s == http.StatusConflict:
			c.calls.WithLabelValues(string(outcomeTransient)).Inc()
			return zero, stripeError{se}
		}
		c.calls.WithLabelValues(string(outcomeRejected)).Inc()
		return zero, backoff.Permanent(fmt.Errorf("%w: %w", refunds.ErrRejected, stripeError{se}))
	},
		backoff.WithBackOff(&backoff.ExponentialBackOff{
			InitialInterval: backoffInitial, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: backoffMax,
		}),
		backoff.WithMaxElapsedTime(c.cfg.MaxElapsed),
		backoff.WithNotify(func(err error, next time.Duration) {
			c.logger.WarnContext(ctx, "stripe attempt failed, retrying", "call", what, "attempt", attempts, "retry_in", next, "err", err)
		}),
	)
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, refunds.ErrRejected), errors.Is(err, ErrIndeterminate):
		return zero, fmt.Errorf("%s: %w", what, err)
	default:
		return zero, fmt.Errorf("%s after %d attempts: %w: %w", what, attempts, ErrUnavailable, err)
	}
}

func stateOf(r *stripe.Refund) refunds.StripeRefund {
	st := refunds.StripeRefund{
		ID: r.ID, Amount: r.Amount, Currency: string(r.Currency), Status: string(r.Status),
		FailureReason: string(r.FailureReason), Metadata: r.Metadata,
	}
	if r.PaymentIntent != nil {
		st.PaymentIntentID = r.PaymentIntent.ID
	}
	return st
}
