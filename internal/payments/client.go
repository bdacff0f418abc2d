// Package payments talks to Stripe's PaymentIntents API with stripe-go v76,
// one step per call (create, confirm, cancel, retrieve, search), and
// classifies each answer the way Stripe's idempotency rules require
// (https://docs.stripe.com/api/idempotent_requests,
// https://docs.stripe.com/error-low-level):
//
//   - network errors, timeouts, 409 (idempotency_key_in_use, lock_timeout),
//     429 and 503 are not stored by Stripe: retried here with the same key
//     and the same parameters;
//   - a 500 (any 5xx but 503) on a write is stored under the key and replayed
//     to every retry: the outcome is indeterminate, and the caller must
//     reconcile (stripestep.ErrIndeterminate), never resend;
//   - 401 and 403 refuse our own credentials, not the payment: not retried,
//     nothing stored (stripestep.ErrCredentials);
//   - 402 card_error is a decline and any other 4xx a rejection: final
//     (*checkout.PaymentRefusal, a stripestep.Refusal).
//
// classify is the one place that reads Stripe's errors; the sagas take the
// outcome an attempt records from stripestep.OutcomeOf over what it
// returns, for PaymentIntents and refunds alike.
package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/stripestep"
	"github.com/onceonly/checkout/internal/tracing"
)

// ErrUnavailable is stripestep.ErrUnanswered: no final answer within
// Config.MaxElapsed (or before the context ended). Resending the same
// request with the same key is safe.
var ErrUnavailable = stripestep.ErrUnanswered

// ErrIndeterminate is stripestep.ErrIndeterminate: Stripe stored an error
// (a 500) under the key; reconcile before any new attempt.
var ErrIndeterminate = stripestep.ErrIndeterminate

// ErrNoIdempotencyKey is returned, without any HTTP request, by a write
// whose request has no idempotency key: stripe-go would otherwise generate a
// random one per attempt, which would let a retry execute twice.
var ErrNoIdempotencyKey = errors.New("payments: a write needs an idempotency key")

// Defaults for zero Config fields.
const (
	DefaultAPIBase    = "https://api.stripe.com"
	DefaultTimeout    = 10 * time.Second
	DefaultMaxElapsed = 20 * time.Second
)

// CheckAPIBase reports whether s can be a Config.APIBase: an absolute http
// or https URL with a host (a path prefix is kept; a query or fragment could
// not be, as each request's path is appended to it).
func CheckAPIBase(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q must be an http or https URL, e.g. %s", s, DefaultAPIBase)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("%q has no host", s)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return fmt.Errorf("%q must not have a query or fragment", s)
	}
	return nil
}

// Config configures a Client. Zero fields take the Default* values.
type Config struct {
	// APIBase is the Stripe API base URL without a path, e.g.
	// "https://api.stripe.com" or "http://127.0.0.1:12111" for the emulator
	// (env STRIPE_API_BASE).
	APIBase string
	// SecretKey is the Stripe secret key, "sk_test_…" or "sk_live_…", sent as
	// a Bearer token (env STRIPE_SECRET_KEY).
	SecretKey string
	// Timeout bounds one HTTP attempt (env STRIPE_TIMEOUT). An attempt that
	// times out may have been executed by Stripe; the retry with the same key
	// replays it.
	Timeout time.Duration
	// MaxElapsed bounds the time spent retrying one call (env
	// STRIPE_MAX_ELAPSED): no new attempt starts after it, so a call returns
	// within about MaxElapsed + Timeout.
	MaxElapsed time.Duration
}

// Backoff between attempts: exponential with jitter, as Stripe recommends
// (https://docs.stripe.com/error-low-level#idempotency). The first retry
// comes quickly because a dropped response or a 409 in flight usually
// resolves in well under a second.
const (
	backoffInitial = 100 * time.Millisecond
	backoffMax     = 2 * time.Second
)

// Client calls Stripe's PaymentIntents API. It is safe for concurrent use.
type Client struct {
	cfg    Config
	pi     paymentintent.Client
	logger *slog.Logger
	calls  *prometheus.CounterVec
}

var _ checkout.PaymentProvider = (*Client)(nil)

// NewClient returns a Client for cfg. stripe-go's own retries are turned off
// (MaxNetworkRetries 0) so that every retry is decided, logged and counted
// here. reg may be nil; otherwise the metric checkout_stripe_calls_total is
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
		HTTPClient:        &http.Client{Timeout: cfg.Timeout + time.Second, Transport: tracing.HTTPTransport(transport())},
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

// Config returns the client's configuration with defaults applied.
func (c *Client) Config() Config { return c.cfg }

// CreatePaymentIntent creates an unconfirmed PaymentIntent: POST
// /v1/payment_intents with amount, currency, payment_method,
// payment_method_types[]=card, confirm=false, metadata[order_id] and
// metadata[tenant_id], under req.IdempotencyKey
// (https://docs.stripe.com/api/payment_intents/create). Errors: see
// checkout.PaymentProvider; an unknown payment method is a
// *checkout.PaymentRefusal (400 resource_missing).
func (c *Client) CreatePaymentIntent(ctx context.Context, req checkout.CreateIntentRequest) (checkout.PaymentIntentState, error) {
	if strings.TrimSpace(req.IdempotencyKey) == "" {
		return checkout.PaymentIntentState{}, ErrNoIdempotencyKey
	}
	return c.call(ctx, opCreate, req.IdempotencyKey, func(actx context.Context) (*stripe.PaymentIntent, error) {
		p := &stripe.PaymentIntentParams{
			Amount:             stripe.Int64(req.Amount),
			Currency:           stripe.String(req.Currency),
			PaymentMethod:      stripe.String(req.PaymentMethod),
			PaymentMethodTypes: stripe.StringSlice([]string{"card"}),
			Confirm:            stripe.Bool(false),
		}
		p.Context = actx
		p.SetIdempotencyKey(req.IdempotencyKey)
		p.AddMetadata("order_id", req.OrderID)
		p.AddMetadata("tenant_id", req.TenantID)
		return c.pi.New(p)
	})
}

// ConfirmPaymentIntent confirms a PaymentIntent with the payment method it
// was created with: POST /v1/payment_intents/{id}/confirm under
// req.IdempotencyKey (https://docs.stripe.com/api/payment_intents/confirm).
// A 3D Secure card answers with status requires_action and a next_action
// (redirect_to_url when req.ReturnURL is set, use_stripe_sdk otherwise); a
// declined card is a *checkout.PaymentRefusal with Declined set.
func (c *Client) ConfirmPaymentIntent(ctx context.Context, req checkout.ConfirmIntentRequest) (checkout.PaymentIntentState, error) {
	if strings.TrimSpace(req.IdempotencyKey) == "" {
		return checkout.PaymentIntentState{}, ErrNoIdempotencyKey
	}
	return c.call(ctx, opConfirm, req.IdempotencyKey, func(actx context.Context) (*stripe.PaymentIntent, error) {
		p := &stripe.PaymentIntentConfirmParams{}
		if req.ReturnURL != "" {
			p.ReturnURL = stripe.String(req.ReturnURL)
		}
		p.Context = actx
		p.SetIdempotencyKey(req.IdempotencyKey)
		return c.pi.Confirm(req.PaymentIntentID, p)
	})
}

// CancelPaymentIntent cancels a PaymentIntent: POST
// /v1/payment_intents/{id}/cancel with cancellation_reason, under
// req.IdempotencyKey (https://docs.stripe.com/api/payment_intents/cancel).
// A PaymentIntent that is already succeeded (or canceled) cannot be
// canceled: a *checkout.PaymentRefusal (400 payment_intent_unexpected_state).
func (c *Client) CancelPaymentIntent(ctx context.Context, req checkout.CancelIntentRequest) (checkout.PaymentIntentState, error) {
	if strings.TrimSpace(req.IdempotencyKey) == "" {
		return checkout.PaymentIntentState{}, ErrNoIdempotencyKey
	}
	return c.call(ctx, opCancel, req.IdempotencyKey, func(actx context.Context) (*stripe.PaymentIntent, error) {
		p := &stripe.PaymentIntentCancelParams{}
		if req.Reason != "" {
			p.CancellationReason = stripe.String(req.Reason)
		}
		p.Context = actx
		p.SetIdempotencyKey(req.IdempotencyKey)
		return c.pi.Cancel(req.PaymentIntentID, p)
	})
}

// RetrievePaymentIntent reads a PaymentIntent: GET /v1/payment_intents/{id}
// (https://docs.stripe.com/api/payment_intents/retrieve), strongly
// consistent. Reads are safe to repeat, so every 5xx is retried. An unknown
// id is a *checkout.PaymentRefusal (404 resource_missing).
func (c *Client) RetrievePaymentIntent(ctx context.Context, id string) (checkout.PaymentIntentState, error) {
	return c.call(ctx, opRetrieve, "", func(actx context.Context) (*stripe.PaymentIntent, error) {
		p := &stripe.PaymentIntentParams{}
		p.Context = actx
		return c.pi.Get(id, p)
	})
}

// SearchPaymentIntents returns every PaymentIntent with
// metadata['order_id'] = orderID, oldest first: GET
// /v1/payment_intents/search?query=metadata['order_id']:'…'
// (https://docs.stripe.com/search#search-query-language). Search is
// eventually consistent: objects appear about a minute after they were
// created (https://docs.stripe.com/search#data-freshness), so an empty
// result proves nothing until then.
func (c *Client) SearchPaymentIntents(ctx context.Context, orderID string) ([]checkout.PaymentIntentState, error) {
	if strings.ContainsAny(orderID, `'\`) {
		return nil, fmt.Errorf("search payment intents: order id %q cannot be quoted", orderID)
	}
	op := func() ([]checkout.PaymentIntentState, error) {
		actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
		p := &stripe.PaymentIntentSearchParams{}
		p.Context = actx
		p.Query = "metadata['order_id']:'" + orderID + "'"
		p.Limit = stripe.Int64(100)
		it := c.pi.Search(p)
		var got []checkout.PaymentIntentState
		for it.Next() {
			got = append(got, stateOf(it.PaymentIntent()))
		}
		res, err := classify(it.Err(), false)
		c.calls.WithLabelValues(string(opSearch), string(res)).Inc()
		if err != nil && res != resultTransient {
			return nil, backoff.Permanent(err)
		}
		return got, err
	}
	out, err := retry(c, ctx, opSearch, "", op)
	if err != nil {
		return nil, err
	}
	// Oldest first, so that every caller adopts the same one.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && (out[j].Created < out[j-1].Created ||
			out[j].Created == out[j-1].Created && out[j].ID < out[j-1].ID); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

// op names a call in logs and in the op label of checkout_stripe_calls_total.
type op string

const (
	opCreate   op = "create"
	opConfirm  op = "confirm"
	opCancel   op = "cancel"
	opRetrieve op = "retrieve"
	opSearch   op = "search"
)

// result is the result label of one HTTP attempt.
type result string

// The values of the result label of checkout_stripe_calls_total.
const (
	resultSucceeded     result = "succeeded"     // a PaymentIntent (or a search result) came back
	resultDeclined      result = "declined"      // 402 card_error
	resultTransient     result = "transient"     // retried: network, timeout, 409, 429, 503 (any 5xx on a read)
	resultIndeterminate result = "indeterminate" // a 500 on a write: stored by Stripe, not retried
	resultRejected      result = "rejected"      // not retried: another 4xx
	// resultCredentials: 401 or 403, Stripe refused our own secret key (a
	// rotated or revoked key, a restricted key without the permission).
	// Not retried, not the customer's fault, nothing stored under the key.
	resultCredentials result = "credentials_refused"
)

// call runs one PaymentIntent write or read with retries (see callT).
func (c *Client) call(ctx context.Context, o op, key string, do func(context.Context) (*stripe.PaymentIntent, error)) (checkout.PaymentIntentState, error) {
	return callT(ctx, c, o, key, func(actx context.Context) (checkout.PaymentIntentState, error) {
		pi, err := do(actx)
		if err != nil {
			return checkout.PaymentIntentState{}, err
		}
		return stateOf(pi), nil
	})
}

// callT runs one write or read with retries, each attempt bounded by
// Config.Timeout and classified (classify): answers Stripe does not store
// are retried with the same key; any other error is final. key is the
// idempotency key of a write, "" for a read.
func callT[T any](ctx context.Context, c *Client, o op, key string, do func(context.Context) (T, error)) (T, error) {
	write := key != ""
	tries := 0
	attempt := func() (T, error) {
		var zero T
		tries++
		// One span per try, so a retry under the same key shows as a
		// second stripe span with the same key and the next attempt.
		sctx, span := tracing.Start(ctx, "stripe "+string(o), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(tracing.AttrIdempotencyKey.String(key), tracing.AttrAttempt.Int(tries)))
		actx, cancel := context.WithTimeout(sctx, c.cfg.Timeout)
		defer cancel()
		v, err := do(actx)
		tracing.End(span, err)
		res, err := classify(err, write)
		c.calls.WithLabelValues(string(o), string(res)).Inc()
		switch {
		case err == nil:
			return v, nil
		case res == resultTransient:
			return zero, err
		default:
			return zero, backoff.Permanent(err)
		}
	}
	return retry(c, ctx, o, key, attempt)
}

// retry runs attempt with exponential backoff until it succeeds, fails
// permanently, Config.MaxElapsed passes or ctx ends. Giving up on transient
// failures wraps ErrUnavailable (and ctx's error when ctx ended it).
func retry[T any](c *Client, ctx context.Context, o op, key string, attempt func() (T, error)) (T, error) {
	n := 0
	counted := func() (T, error) { n++; return attempt() }
	notify := func(err error, next time.Duration) {
		c.logger.WarnContext(ctx, "stripe call failed, retrying with the same key",
			"op", o, "idempotency_key", key, "attempt", n, "retry_in", next, "err", err)
	}
	v, err := backoff.Retry(ctx, counted,
		backoff.WithBackOff(&backoff.ExponentialBackOff{
			InitialInterval:     backoffInitial,
			RandomizationFactor: 0.5,
			Multiplier:          2,
			MaxInterval:         backoffMax,
		}),
		backoff.WithMaxElapsedTime(c.cfg.MaxElapsed),
		backoff.WithNotify(notify),
	)
	if err == nil {
		return v, nil
	}
	if stripestep.Final(err) {
		return v, fmt.Errorf("stripe %s: %w", o, err)
	}
	return v, fmt.Errorf("stripe %s after %d attempts: %w: %w", o, n, ErrUnavailable, err)
}

// classify names the result of one attempt and returns the error to act on:
// nil, a transient error (retry), a *checkout.PaymentRefusal, or an error
// wrapping stripestep.ErrIndeterminate or stripestep.ErrCredentials.
func classify(err error, write bool) (result, error) {
	if err == nil {
		return resultSucceeded, nil
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		// Network error, per-attempt timeout, or a body that is not Stripe's
		// JSON (a proxy's 502 page): Stripe gave no answer it stored.
		return resultTransient, fmt.Errorf("stripe request: %w", err)
	}
	e := stripeError{se}
	switch {
	case se.HTTPStatusCode == http.StatusConflict, se.HTTPStatusCode == http.StatusTooManyRequests,
		se.HTTPStatusCode == http.StatusServiceUnavailable:
		// 409 idempotency_key_in_use (an earlier attempt still runs) or
		// lock_timeout, 429 rate_limit and 503: Stripe stored nothing
		// under the key; the same request may be sent again.
		return resultTransient, e
	case se.HTTPStatusCode >= 500 && !write:
		return resultTransient, e // a read is safe to repeat
	case se.HTTPStatusCode >= 500:
		// "Stripe stores ... the first request under the key, including
		// 500 errors": resending replays this answer. Reconcile.
		return resultIndeterminate, fmt.Errorf("%w: %w", ErrIndeterminate, e)
	case se.HTTPStatusCode == http.StatusUnauthorized, se.HTTPStatusCode == http.StatusForbidden:
		// Authentication comes before execution: nothing was stored under
		// the key, and the payment was not refused. Final for this call;
		// the saga keeps the step open for when the key is fixed.
		return resultCredentials, fmt.Errorf("%w: %w", stripestep.ErrCredentials, e)
	case se.Type == stripe.ErrorTypeIdempotency:
		// The key was used with other parameters: the first request's
		// outcome is unknown to this call. Never treat it as final.
		return resultIndeterminate, fmt.Errorf("%w: %w", ErrIndeterminate, e)
	}
	r := &checkout.PaymentRefusal{
		Declined:   se.Type == stripe.ErrorTypeCard,
		HTTPStatus: se.HTTPStatusCode,
		Type:       string(se.Type), Code: string(se.Code), DeclineCode: string(se.DeclineCode),
		Param: se.Param, Message: se.Msg,
	}
	if se.PaymentIntent != nil {
		s := stateOf(se.PaymentIntent)
		r.PaymentIntent = &s
	}
	if r.Declined {
		return resultDeclined, r
	}
	return resultRejected, r
}

// stateOf converts stripe-go's PaymentIntent. next_action is taken from the
// raw JSON when there is one, so that it is passed on as Stripe sent it.
func stateOf(pi *stripe.PaymentIntent) checkout.PaymentIntentState {
	s := checkout.PaymentIntentState{
		ID: pi.ID, Status: stripeintent.Status(pi.Status), Amount: pi.Amount, Currency: string(pi.Currency),
		Metadata: pi.Metadata, ClientSecret: pi.ClientSecret,
		CancellationReason: string(pi.CancellationReason), Created: pi.Created,
	}
	if e := pi.LastPaymentError; e != nil {
		s.LastErrorCode, s.LastDeclineCode = string(e.Code), string(e.DeclineCode)
	}
	if pi.LastResponse != nil && len(pi.LastResponse.RawJSON) > 0 {
		var raw struct {
			NextAction json.RawMessage `json:"next_action"`
		}
		if json.Unmarshal(pi.LastResponse.RawJSON, &raw) == nil && len(raw.NextAction) > 0 && string(raw.NextAction) != "null" {
			s.NextAction = raw.NextAction
		}
	} else if pi.NextAction != nil {
		s.NextAction, _ = json.Marshal(map[string]any{"type": pi.NextAction.Type})
	}
	return s
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

// transport is the HTTP transport of every Stripe call: net/http's default
// one, but keeping as many idle connections to Stripe as checkouts run at
// once. The default keeps 2 per host, so under load most calls would open
// (and for Stripe, TLS-handshake) a new connection and leave the old one in
// TIME_WAIT.
func transport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 256, 256
	return t
}
