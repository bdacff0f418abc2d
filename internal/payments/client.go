// Package payments charges cards through Stripe's PaymentIntents API with
// stripe-go v76, retrying transient failures with the same idempotency key so
// that a charge is never made twice.
package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"

	"github.com/onceonly/checkout/internal/checkout"
)

// ErrUnavailable is wrapped by Charge's error when Stripe could not be reached
// or kept answering with a transient failure (5xx, 429, 409
// idempotency_key_in_use or lock_timeout, a network error, a per-attempt
// timeout) until Config.MaxElapsed passed or the context was done. The outcome
// is unknown: the charge may have been made. Calling Charge again with the
// same ChargeRequest is safe and returns the first outcome.
var ErrUnavailable = errors.New("payment provider unavailable")

// ErrRejected is wrapped by Charge's error when Stripe refused the request
// itself (4xx other than a card decline, 409 and 429, e.g.
// invalid_request_error, authentication, or idempotency_error for a key reused
// with other parameters), or when the ChargeRequest has no idempotency key.
// Nothing was charged and retrying the same request cannot succeed.
var ErrRejected = errors.New("payment request rejected")

// Defaults for zero Config fields.
const (
	DefaultAPIBase    = "https://api.stripe.com"
	DefaultTimeout    = 10 * time.Second
	DefaultMaxElapsed = 30 * time.Second
)

// Config configures a Client. Zero fields take the Default* values.
type Config struct {
	// APIBase is the Stripe API base URL without a path, e.g.
	// "https://api.stripe.com" or "http://127.0.0.1:12111" for the emulator
	// (env STRIPE_API_BASE).
	APIBase string
	// SecretKey is the Stripe secret key, "sk_test_…" or "sk_live_…", sent as
	// a Bearer token (env STRIPE_SECRET_KEY).
	SecretKey string
	// Timeout bounds one HTTP attempt. An attempt that times out may have been
	// executed by Stripe; the retry replays it through the idempotency key.
	Timeout time.Duration
	// MaxElapsed bounds the time spent retrying: no new attempt starts after
	// it, so Charge returns within about MaxElapsed + Timeout.
	MaxElapsed time.Duration
}

// Backoff between attempts: exponential with jitter, as Stripe recommends for
// retries (https://docs.stripe.com/error-low-level#idempotency). The first
// retry comes quickly because a dropped response or a 409 in flight usually
// resolves in well under a second.
const (
	backoffInitial = 100 * time.Millisecond
	backoffMax     = 2 * time.Second
)

// Client creates and confirms PaymentIntents. It is safe for concurrent use.
type Client struct {
	cfg    Config
	pi     paymentintent.Client
	logger *slog.Logger
	calls  *prometheus.CounterVec
}

var _ checkout.PaymentProvider = (*Client)(nil)

// NewClient returns a Client for cfg. stripe-go's own retries are turned off
// (MaxNetworkRetries 0) so that every retry is made, logged and counted here.
// reg may be nil; otherwise the metric checkout_stripe_calls_total is
// registered on it (or reused if another Client registered it already).
func NewClient(cfg Config, logger *slog.Logger, reg prometheus.Registerer) *Client {
	if cfg.APIBase == "" {
		cfg.APIBase = DefaultAPIBase
	}
	cfg.APIBase = strings.TrimRight(cfg.APIBase, "/")
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxElapsed <= 0 {
		cfg.MaxElapsed = DefaultMaxElapsed
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(cfg.APIBase),
		// Each attempt is bounded by its context (Config.Timeout); the
		// client-wide timeout is only a backstop.
		HTTPClient:        &http.Client{Timeout: cfg.Timeout + time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     stripeLogger{logger},
	})
	return &Client{
		cfg:    cfg,
		pi:     paymentintent.Client{B: backend, Key: cfg.SecretKey},
		logger: logger,
		calls:  registerCalls(reg),
	}
}

// Charge creates and confirms a PaymentIntent (POST /v1/payment_intents with
// amount, currency, payment_method, confirm=true, payment_method_types
// ["card"] and metadata order_id and tenant_id), sending req.IdempotencyKey as
// the Idempotency-Key header.
//
// Transient failures are retried with exponential backoff until
// Config.MaxElapsed or ctx is done; every attempt sends the same key and the
// same parameters, so Stripe executes the charge at most once and replays its
// result to later attempts.
//
// It returns:
//   - the PaymentIntent's id and status and a nil error when Stripe answered
//     with a PaymentIntent. Its status is usually "succeeded", but a
//     PaymentIntent that needs more (requires_action for 3D Secure,
//     processing, requires_capture) is returned as-is, not Declined: the caller
//     decides what a non-succeeded status means;
//   - Declined, the PaymentIntent's id and status and the decline code (the
//     card_error's decline_code, else its code) and a nil error on a card
//     decline (402 card_error);
//   - an error wrapping ErrRejected when the request is refused as such, with
//     no retry (see ErrRejected);
//   - an error wrapping ErrUnavailable (and ctx's error when ctx ended the
//     retries) when the outcome is unknown (see ErrUnavailable).
func (c *Client) Charge(ctx context.Context, req checkout.ChargeRequest) (checkout.ChargeResult, error) {
	if strings.TrimSpace(req.IdempotencyKey) == "" {
		// stripe-go would generate a random key per attempt, which would let a
		// retry charge twice.
		return checkout.ChargeResult{}, fmt.Errorf("charge order %s: %w: empty idempotency key", req.OrderID, ErrRejected)
	}
	attempts := 0
	op := func() (checkout.ChargeResult, error) {
		attempts++
		res, out, err := c.attempt(ctx, req)
		c.calls.WithLabelValues(string(out)).Inc()
		if out == outcomeRejected {
			return res, backoff.Permanent(err)
		}
		return res, err
	}
	notify := func(err error, next time.Duration) {
		c.logger.WarnContext(ctx, "stripe charge attempt failed, retrying",
			"order_id", req.OrderID, "attempt", attempts, "retry_in", next, "err", err)
	}
	res, err := backoff.Retry(ctx, op,
		backoff.WithBackOff(&backoff.ExponentialBackOff{
			InitialInterval:     backoffInitial,
			RandomizationFactor: 0.5,
			Multiplier:          2,
			MaxInterval:         backoffMax,
		}),
		backoff.WithMaxElapsedTime(c.cfg.MaxElapsed),
		backoff.WithNotify(notify),
	)
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, ErrRejected):
		return checkout.ChargeResult{}, fmt.Errorf("charge order %s: %w", req.OrderID, err)
	default:
		return checkout.ChargeResult{}, fmt.Errorf("charge order %s after %d attempts: %w: %w", req.OrderID, attempts, ErrUnavailable, err)
	}
}

// outcome is the result label of one HTTP attempt.
type outcome string

// The values of the result label of checkout_stripe_calls_total.
const (
	outcomeSucceeded outcome = "succeeded" // a PaymentIntent came back, whatever its status
	outcomeDeclined  outcome = "declined"  // 402 card_error
	outcomeTransient outcome = "transient" // retried: 5xx, 429, 409, network, timeout
	outcomeRejected  outcome = "rejected"  // not retried: other 4xx
)

// attempt makes one HTTP call and classifies its result. A transient error is
// returned as-is; a rejected one wraps ErrRejected.
func (c *Client) attempt(ctx context.Context, req checkout.ChargeRequest) (checkout.ChargeResult, outcome, error) {
	actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	pi, err := c.pi.New(c.params(actx, req))
	if err == nil {
		return checkout.ChargeResult{PaymentIntentID: pi.ID, Status: string(pi.Status)}, outcomeSucceeded, nil
	}

	var se *stripe.Error
	if !errors.As(err, &se) {
		// Network error, per-attempt timeout, or a body that is not Stripe's
		// JSON (a proxy's 502 page): the request may or may not have run.
		return checkout.ChargeResult{}, outcomeTransient, fmt.Errorf("stripe request: %w", err)
	}
	e := stripeError{se}
	switch {
	case se.Type == stripe.ErrorTypeCard:
		res := checkout.ChargeResult{Declined: true, DeclineCode: string(se.DeclineCode)}
		if res.DeclineCode == "" {
			res.DeclineCode = string(se.Code)
		}
		if se.PaymentIntent != nil {
			res.PaymentIntentID, res.Status = se.PaymentIntent.ID, string(se.PaymentIntent.Status)
		}
		if res.Status == "" {
			res.Status = string(stripe.PaymentIntentStatusRequiresPaymentMethod)
		}
		return res, outcomeDeclined, nil
	case se.HTTPStatusCode >= 500, se.HTTPStatusCode == http.StatusTooManyRequests,
		se.HTTPStatusCode == http.StatusConflict:
		// 409 is idempotency_key_in_use (an earlier attempt still runs) or
		// lock_timeout: both resolve by waiting.
		return checkout.ChargeResult{}, outcomeTransient, e
	default:
		return checkout.ChargeResult{}, outcomeRejected, fmt.Errorf("%w: %w", ErrRejected, e)
	}
}

// params builds the request parameters. They depend only on req, so every
// attempt sends the same form body, which Stripe's idempotency rules require
// for a replay.
func (c *Client) params(ctx context.Context, req checkout.ChargeRequest) *stripe.PaymentIntentParams {
	p := &stripe.PaymentIntentParams{
		Amount:             stripe.Int64(req.Amount),
		Currency:           stripe.String(req.Currency),
		PaymentMethod:      stripe.String(req.PaymentMethod),
		Confirm:            stripe.Bool(true),
		PaymentMethodTypes: stripe.StringSlice([]string{"card"}),
	}
	p.Context = ctx
	p.SetIdempotencyKey(req.IdempotencyKey)
	p.AddMetadata("order_id", req.OrderID)
	p.AddMetadata("tenant_id", req.TenantID)
	return p
}

// stripeError gives a *stripe.Error a one-line message (its own Error is the
// whole JSON object) while keeping it reachable with errors.As.
type stripeError struct{ e *stripe.Error }

// Error returns e.g. "stripe 500 api_error: An unknown error occurred".
func (s stripeError) Error() string {
	kind := string(s.e.Type)
	if s.e.Code != "" {
		kind += "/" + string(s.e.Code)
	}
	return fmt.Sprintf("stripe %d %s: %s", s.e.HTTPStatusCode, kind, s.e.Msg)
}

// Unwrap returns the *stripe.Error.
func (s stripeError) Unwrap() error { return s.e }
