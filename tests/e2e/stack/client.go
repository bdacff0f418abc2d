package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Order is the part of the API's order the tests look at.
type Order struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Email   string `json:"email"`
	Payment struct {
		PaymentIntentID string `json:"payment_intent_id"`
		Status          string `json:"status"`
	} `json:"payment"`
	Notifications []struct {
		Channel string `json:"channel"`
		Status  string `json:"status"`
	} `json:"notifications"`
}

// Result is one HTTP answer to a checkout. Status 0 means the request got no
// answer at all (Err says why).
type Result struct {
	Status   int
	Code     string // the problem's code, when the body is a problem
	Replayed bool   // Idempotent-Replayed: true
	Body     []byte
	Order    *Order // decoded on 201, 202 and 200
	Err      error
}

// Final reports whether r is an answer the client must not retry: an
// outcome the service stored (201, 402, 409 out_of_stock) or a request
// error (400, 401, 415, 422). 409 in use, 5xx, the gateway's 504 and no
// answer at all are retried with the same key.
func (r Result) Final() bool {
	switch {
	case r.Status == 0, r.Status >= 500:
		return false
	case r.Status == http.StatusConflict:
		return r.Code != "idempotency_key_in_use"
	case r.Status == http.StatusTooManyRequests:
		return false
	}
	return true
}

// String is a short form for logs and test messages.
func (r Result) String() string {
	if r.Status == 0 {
		return fmt.Sprintf("no answer (%v)", r.Err)
	}
	return fmt.Sprintf("%d %s replayed=%v", r.Status, r.Code, r.Replayed)
}

// Client calls the checkout API as a tenant.
type Client struct {
	// BaseURL is the gateway's or the API's URL.
	BaseURL string
	// APIKey is the tenant's bearer key (sk_test_acme is tenant "acme").
	APIKey string
	// HTTP is the client used; its Timeout bounds one attempt.
	HTTP *http.Client
	// Header is added to every request (optional), e.g. a traceparent.
	Header http.Header
}

// Body is a checkout request body.
type Body struct {
	Email         string `json:"email"`
	Items         []Item `json:"items"`
	PaymentMethod string `json:"payment_method"`
}

// Item is a line of a Body.
type Item struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// TeeBody returns a paid checkout of n T-shirts for email.
func TeeBody(email string, n int) Body {
	return Body{Email: email, Items: []Item{{SKU: "sku_tee", Quantity: n}}, PaymentMethod: "pm_card_visa"}
}

// Checkout sends one POST /v1/checkouts with the Idempotency-Key key.
func (c *Client) Checkout(ctx context.Context, key string, body Body) Result {
	b, _ := json.Marshal(body)
	return c.Post(ctx, "/v1/checkouts", key, b)
}

// Post sends one POST of the JSON body b to path with the
// Idempotency-Key key; the Result holds the answer, or Err for none.
func (c *Client) Post(ctx context.Context, path, key string, b []byte) Result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+path, bytes.NewReader(b))
	if err != nil {
		return Result{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Result{Err: err}
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	r := Result{Status: resp.StatusCode, Body: rb, Err: err, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	var p struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(rb, &p) == nil {
		r.Code = p.Code
	}
	if resp.StatusCode == http.StatusCreated || resp.StatusCode == http.StatusAccepted || resp.StatusCode == http.StatusOK {
		var o Order
		if err := json.Unmarshal(rb, &o); err == nil {
			r.Order = &o
		}
	}
	return r
}

// CancelOrder sends POST /v1/orders/{id}/cancel (body {}) with the
// Idempotency-Key key.
func (c *Client) CancelOrder(ctx context.Context, id, key string) Result {
	return c.Post(ctx, "/v1/orders/"+id+"/cancel", key, []byte("{}"))
}

// CheckoutUntilFinal sends the checkout with the same key until the answer
// is Final, waiting every between attempts, and returns every answer in
// order (the last one final) or ctx's error.
func (c *Client) CheckoutUntilFinal(ctx context.Context, key string, body Body, every time.Duration) ([]Result, error) {
	var rs []Result
	for {
		r := c.Checkout(ctx, key, body)
		rs = append(rs, r)
		if r.Final() {
			return rs, nil
		}
		select {
		case <-ctx.Done():
			return rs, fmt.Errorf("key %s: no final answer after %d attempts (last: %s): %w", key, len(rs), r, ctx.Err())
		case <-time.After(every):
		}
	}
}

// GetOrder returns GET /v1/orders/{id}.
func (c *Client) GetOrder(ctx context.Context, id string) (*Order, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/v1/orders/"+id, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.APIKey)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("get order %s: %s", id, resp.Status)
	}
	var o Order
	return &o, json.NewDecoder(resp.Body).Decode(&o)
}

// http30 is shared by the clients of every stack: connections are reused
// across attempts, and one attempt never waits more than 30s.
var http30 = http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 128}}

// Refund sends one POST /v1/orders/{orderID}/refunds with the
// Idempotency-Key key and body (e.g. `{"amount":1000}`).
func (c *Client) Refund(ctx context.Context, orderID, key, body string) Result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/v1/orders/"+orderID+"/refunds", bytes.NewReader([]byte(body)))
	if err != nil {
		return Result{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+c.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Result{Err: err}
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	r := Result{Status: resp.StatusCode, Body: rb, Err: err, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	var p struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(rb, &p) == nil {
		r.Code = p.Code
	}
	return r
}

// RefundUntilFinal sends the refund with the same key until the answer is
// Final, waiting every between attempts, and returns the final answer or
// ctx's error.
func (c *Client) RefundUntilFinal(ctx context.Context, orderID, key, body string, every time.Duration) (Result, error) {
	for {
		r := c.Refund(ctx, orderID, key, body)
		if r.Final() {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("refund key %s: no final answer (last: %s): %w", key, r, ctx.Err())
		case <-time.After(every):
		}
	}
}
