package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client calls the checkout API as one tenant. It is safe for concurrent
// use; make one per tenant and reuse it.
type Client struct {
	base   *url.URL
	apiKey string
	http   *http.Client
	retry  RetryPolicy
}

// Option configures a Client (New).
type Option func(*Client)

// WithHTTPClient sends the requests with h instead of a client of the
// client's own. h's Timeout, if any, bounds one attempt on top of
// RetryPolicy.AttemptTimeout.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// WithRetryPolicy replaces DefaultRetryPolicy; its zero fields keep their
// defaults.
func WithRetryPolicy(p RetryPolicy) Option { return func(c *Client) { c.retry = p } }

// New returns a client of the API at baseURL (e.g. "http://127.0.0.1:8080";
// a path, if any, is kept as a prefix) for the tenant whose API key (a
// CHECKOUT_API_KEYS key, e.g. "sk_test_acme") is apiKey. It returns an
// error when baseURL is not an absolute http or https URL or apiKey is
// empty.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q: want an absolute http or https URL", baseURL)
	}
	if apiKey == "" {
		return nil, errors.New("client: empty API key")
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	c := &Client{base: u, apiKey: apiKey, http: &http.Client{}, retry: DefaultRetryPolicy()}
	for _, o := range opts {
		o(c)
	}
	c.retry = c.retry.withDefaults()
	return c, nil
}

// NewKey returns a fresh Idempotency-Key: "key_" and 32 hex digits of
// crypto/rand, 128 bits, so that two operations never share one. Make it
// once per logical operation, before the first attempt, and keep it until
// a final answer (e.g. with the order in the caller's own storage).
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return "key_" + hex.EncodeToString(b[:])
}

// OrderResult is an order with how it was obtained.
type OrderResult struct {
	Order Order
	Call
}

// RefundResult is a refund with how it was obtained.
type RefundResult struct {
	Refund Refund
	Call
}

// ProductsResult is the catalog with how it was obtained.
type ProductsResult struct {
	Products []Product
	Call
}

// CreateCheckout sends POST /v1/checkouts under key ("" makes one:
// NewKey), retrying transient answers with that key and the same body.
// It returns the order on 201 (paid) and on 202 (Order.Status
// requires_action: send the customer to Order.Payment.NextAction). Every
// other final answer is an *Error: 402 card_declined or payment_rejected
// (Error.OrderID is the failed order), 409 out_of_stock, 422
// idempotency_key_reused (the key was used for another request), 400
// validation_error (Error.Errors). An *Error with Temporary() true means
// the outcome is still open: call again later with Error.IdempotencyKey.
func (c *Client) CreateCheckout(ctx context.Context, key string, req CheckoutRequest) (*OrderResult, error) {
	var r OrderResult
	call, err := c.do(ctx, http.MethodPost, "/v1/checkouts", key, req, &r.Order)
	r.Call = call
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// GetOrder returns the tenant's order id with its refunds and
// notifications (GET /v1/orders/{id}); another tenant's or an unknown
// order is an *Error with code not_found. Transient answers are retried.
func (c *Client) GetOrder(ctx context.Context, id string) (*OrderResult, error) {
	var r OrderResult
	call, err := c.do(ctx, http.MethodGet, "/v1/orders/"+url.PathEscape(id), "", nil, &r.Order)
	r.Call = call
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// CancelOrder cancels order id while it waits for the customer's
// authentication (POST /v1/orders/{id}/cancel under key, "" makes one):
// its PaymentIntent is canceled at Stripe and its stock released, and the
// result is the canceled order. Any other status is an *Error with code
// order_not_cancelable (409), and so is an order whose payment Stripe had
// already taken when the cancel reached it: the order is then paid, as
// GetOrder shows.
func (c *Client) CancelOrder(ctx context.Context, id, key string) (*OrderResult, error) {
	var r OrderResult
	call, err := c.do(ctx, http.MethodPost, "/v1/orders/"+url.PathEscape(id)+"/cancel", key, struct{}{}, &r.Order)
	r.Call = call
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// CreateRefund refunds order id, in part or in full (POST
// /v1/orders/{id}/refunds under key, "" makes one). The refund is as
// Stripe answered it (often pending; GetOrder shows it later). Final
// errors: 409 order_not_refundable, 409 refund_exceeds_payment
// (Error.AmountRefundable is what is left), 404 not_found, 422.
func (c *Client) CreateRefund(ctx context.Context, id, key string, req RefundRequest) (*RefundResult, error) {
	var r RefundResult
	call, err := c.do(ctx, http.MethodPost, "/v1/orders/"+url.PathEscape(id)+"/refunds", key, req, &r.Refund)
	r.Call = call
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// ListProducts returns the catalog with the current stock (GET
// /v1/products).
func (c *Client) ListProducts(ctx context.Context) (*ProductsResult, error) {
	var body struct {
		Data []Product `json:"data"`
	}
	call, err := c.do(ctx, http.MethodGet, "/v1/products", "", nil, &body)
	if err != nil {
		return nil, err
	}
	return &ProductsResult{Products: body.Data, Call: call}, nil
}

// answer is one attempt's outcome.
type answer struct {
	status     int
	header     http.Header
	body       []byte
	err        error // transport error: no (complete) answer
	retryAfter time.Duration
	problem    Problem
}

// do runs one logical operation: the same method, path, key and body
// bytes on every attempt, until a final answer or the policy stops it. On
// a 2xx it decodes the body into out.
func (c *Client) do(ctx context.Context, method, path, key string, in, out any) (Call, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return Call{}, fmt.Errorf("client: encode request: %w", err)
		}
		if key == "" {
			key = NewKey()
		}
	}
	p := c.retry
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.MaxElapsed)
		defer cancel()
	}
	call := Call{IdempotencyKey: key}
	for {
		call.Attempts++
		a := c.attempt(ctx, method, path, key, body)
		call.StatusCode = a.status
		call.Replayed = a.header.Get("Idempotent-Replayed") == "true"
		call.Location = a.header.Get("Location")
		call.RequestID = a.header.Get("X-Request-Id")
		if a.err == nil && a.status >= 200 && a.status < 300 {
			if out != nil {
				if err := json.Unmarshal(a.body, out); err != nil {
					return call, fmt.Errorf("client: decode %d answer to %s %s: %w", a.status, method, path, err)
				}
			}
			return call, nil
		}
		e := &Error{Problem: a.problem, RetryAfter: a.retryAfter, Body: a.body, Call: call, Transport: a.err}
		if !transient(a.status, a.problem.Code) {
			return call, e
		}
		// A transport error caused by the caller's context is the end, not
		// a transient answer.
		if err := ctx.Err(); err != nil {
			e.Stopped = err
			return call, e
		}
		if p.MaxAttempts > 0 && call.Attempts >= p.MaxAttempts {
			e.Stopped = ErrTooManyAttempts
			return call, e
		}
		d := p.wait(call.Attempts, a.retryAfter)
		if deadline, ok := ctx.Deadline(); ok && p.Now().Add(d).After(deadline) {
			e.Stopped = context.DeadlineExceeded
			return call, e
		}
		if err := p.Sleep(ctx, d); err != nil {
			e.Stopped = err
			return call, e
		}
	}
}

// attempt sends one request and reads its whole answer.
func (c *Client) attempt(ctx context.Context, method, path, key string, body []byte) answer {
	ctx, cancel := context.WithTimeout(ctx, c.retry.AttemptTimeout)
	defer cancel()
	u := *c.base
	u.Path += path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return answer{header: http.Header{}, err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json, application/problem+json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{header: http.Header{}, err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		// An answer cut short is no answer: its status cannot be trusted
		// to be the whole story, and the key makes the retry safe.
		return answer{header: http.Header{}, err: fmt.Errorf("read %d answer: %w", resp.StatusCode, err)}
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: b,
		retryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), c.retry.Now())}
	if resp.StatusCode >= 300 {
		a.problem.Status = resp.StatusCode
		if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/problem+json" || mt == "application/json" {
			_ = json.Unmarshal(b, &a.problem) // a body that is not a problem leaves Status alone
			a.problem.Status = resp.StatusCode
		}
	}
	return a
}
