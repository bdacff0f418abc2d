package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/client"
)

// reply is one scripted answer of the fake API; drop closes the connection
// without answering (after the request was read: the answer is lost).
type reply struct {
	status     int
	code       string
	retryAfter string
	replayed   bool
	drop       bool
	body       string // overrides the problem or order body
}

// seen is one request the fake API received.
type seen struct {
	method, path, key, auth, body string
}

// fakeAPI answers with script in order, then with its last reply forever,
// and records every request.
type fakeAPI struct {
	t      testing.TB
	mu     sync.Mutex
	script []reply
	reqs   []seen
	srv    *httptest.Server
}

func newFakeAPI(t testing.TB, script ...reply) *fakeAPI {
	t.Helper()
	f := &fakeAPI{t: t, script: script}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

const orderJSON = `{"id":"ord_0123456789abcdef0123456789abcdef","status":"paid","email":"a@example.com","currency":"usd","amount_total":5000,"items":[{"sku":"sku_tee","quantity":2,"unit_amount":2500,"amount":5000}],"payment":{"provider":"stripe","payment_intent_id":"pi_1","status":"succeeded"},"created_at":"2026-12-02T18:00:00Z"}`

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, seen{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), r.Header.Get("Authorization"), string(b)})
	rep := f.script[min(len(f.reqs), len(f.script))-1]
	n := len(f.reqs)
	f.mu.Unlock()
	w.Header().Set("X-Request-Id", "req_"+strconv.Itoa(n))
	if rep.drop {
		conn, _, err := w.(http.Hijacker).Hijack()
		require.NoError(f.t, err)
		conn.Close()
		return
	}
	if rep.retryAfter != "" {
		w.Header().Set("Retry-After", rep.retryAfter)
	}
	if rep.replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	body := rep.body
	switch {
	case body != "":
		w.Header().Set("Content-Type", "text/plain")
	case rep.status < 300:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/orders/ord_0123456789abcdef0123456789abcdef")
		body = orderJSON
	default:
		w.Header().Set("Content-Type", "application/problem+json")
		body = `{"type":"https://checkout.local/problems/` + rep.code + `","title":"t","status":` + strconv.Itoa(rep.status) +
			`,"detail":"d","code":"` + rep.code + `","order_id":"ord_x"}`
	}
	w.WriteHeader(rep.status)
	_, _ = io.WriteString(w, body)
}

func (f *fakeAPI) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seen(nil), f.reqs...)
}

// sleeper records the policy's waits instead of sleeping.
type sleeper struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (s *sleeper) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	s.mu.Unlock()
	return ctx.Err()
}

// setup is a client of f with a policy that records its waits, a jitter
// of 0.5 and a fixed clock.
func setup(t *testing.T, f *fakeAPI, p client.RetryPolicy) (*client.Client, *sleeper) {
	t.Helper()
	s := &sleeper{}
	if p.Sleep == nil {
		p.Sleep = s.sleep
	}
	if p.Jitter == nil {
		p.Jitter = func() float64 { return 0.5 }
	}
	if p.Now == nil {
		p.Now = func() time.Time { return time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC) }
	}
	c, err := client.New(f.srv.URL, "sk_test_acme", client.WithRetryPolicy(p))
	require.NoError(t, err)
	return c, s
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), time.Hour)
	t.Cleanup(cancel)
	return c
}

var buy = client.CheckoutRequest{Email: "a@example.com", Items: []client.Item{{SKU: "sku_tee", Quantity: 2}}, PaymentMethod: "pm_card_visa"}

// TestTransientAnswersAreRetriedWithTheSameKey: each transient answer is
// followed by a second attempt with the same key and the same body bytes,
// after the wait it asked for (Retry-After) or a backoff.
func TestTransientAnswersAreRetriedWithTheSameKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		first    reply
		wantWait time.Duration // jitter 0.5: Retry-After + 50ms, or half the first ceiling
	}{
		{"no answer (connection dropped after the request)", reply{drop: true}, 50 * time.Millisecond},
		{"409 idempotency_key_in_use waits its Retry-After", reply{status: 409, code: "idempotency_key_in_use", retryAfter: "1"}, 1050 * time.Millisecond},
		{"429 rate_limited waits its Retry-After", reply{status: 429, code: "rate_limited", retryAfter: "3"}, 3050 * time.Millisecond},
		{"429 with an HTTP-date Retry-After waits until then", reply{status: 429, code: "rate_limited", retryAfter: "Wed, 02 Dec 2026 18:00:07 GMT"}, 7050 * time.Millisecond},
		{"502 payment_provider_unavailable", reply{status: 502, code: "payment_provider_unavailable", retryAfter: "2"}, 2050 * time.Millisecond},
		{"503 unavailable", reply{status: 503, code: "unavailable"}, 50 * time.Millisecond},
		{"504 from a gateway, not problem+json", reply{status: 504, body: "Gateway Timeout\n"}, 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t, tc.first, reply{status: 201, replayed: true})
			c, s := setup(t, f, client.RetryPolicy{})

			r, err := c.CreateCheckout(ctx(t), "k-1", buy)
			require.NoError(t, err)
			require.Equal(t, 2, r.Attempts)
			require.True(t, r.Replayed)
			require.Equal(t, 201, r.StatusCode)
			require.Equal(t, "k-1", r.IdempotencyKey)
			require.Equal(t, client.OrderPaid, r.Order.Status)
			require.Equal(t, "/v1/orders/ord_0123456789abcdef0123456789abcdef", r.Location)
			require.Equal(t, []time.Duration{tc.wantWait}, s.waits)

			reqs := f.requests()
			require.Len(t, reqs, 2)
			for _, q := range reqs {
				require.Equal(t, seen{"POST", "/v1/checkouts", "k-1", "Bearer sk_test_acme", reqs[0].body}, q)
			}
			require.JSONEq(t, `{"email":"a@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}`, reqs[0].body)
		})
	}
}

// TestFinalAnswersAreReturnedAtOnce: one attempt, no wait, and the
// problem in a typed error (or the result for a 2xx).
func TestFinalAnswersAreReturnedAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []reply{
		{status: 201},
		{status: 201, replayed: true},
		{status: 202},
		{status: 400, code: "validation_error"},
		{status: 401, code: "unauthorized"},
		{status: 402, code: "card_declined"},
		{status: 402, code: "payment_rejected", replayed: true},
		{status: 404, code: "not_found"},
		{status: 409, code: "out_of_stock"},
		{status: 409, code: "order_not_cancelable"},
		{status: 409, code: "refund_exceeds_payment"},
		{status: 413, code: "payload_too_large"},
		{status: 415, code: "unsupported_media_type"},
		{status: 422, code: "idempotency_key_reused"},
		{status: 500, code: "internal"},
	} {
		t.Run(strconv.Itoa(tc.status)+" "+tc.code, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t, tc, reply{status: 201})
			c, s := setup(t, f, client.RetryPolicy{})

			r, err := c.CreateCheckout(ctx(t), "k-1", buy)
			require.Len(t, f.requests(), 1, "one attempt")
			require.Empty(t, s.waits)
			if tc.status < 300 {
				require.NoError(t, err)
				require.Equal(t, client.Call{IdempotencyKey: "k-1", Attempts: 1, Replayed: tc.replayed, StatusCode: tc.status,
					Location: "/v1/orders/ord_0123456789abcdef0123456789abcdef", RequestID: "req_1"}, r.Call)
				return
			}
			var e *client.Error
			require.ErrorAs(t, err, &e)
			require.Equal(t, tc.status, e.StatusCode)
			require.Equal(t, tc.status, e.Status)
			require.Equal(t, client.Code(tc.code), e.Code)
			require.Equal(t, "d", e.Detail)
			require.Equal(t, "ord_x", e.OrderID)
			require.Equal(t, 1, e.Attempts)
			require.Equal(t, tc.replayed, e.Replayed)
			require.Equal(t, "k-1", e.IdempotencyKey)
			require.Nil(t, e.Stopped)
			require.False(t, e.Temporary())
			require.True(t, client.IsCode(err, client.Code(tc.code)))
		})
	}
}

// TestBackoffIsCappedAndJittered: without Retry-After the waits are a
// jitter fraction of a ceiling that doubles from BaseDelay up to MaxDelay.
func TestBackoffIsCappedAndJittered(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, reply{status: 503, code: "unavailable"}, reply{status: 503, code: "unavailable"},
		reply{status: 503, code: "unavailable"}, reply{status: 503, code: "unavailable"},
		reply{status: 503, code: "unavailable"}, reply{status: 201})
	jitters := []float64{1, 0.999, 0, 1, 0.25}
	var i int
	c, s := setup(t, f, client.RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: 300 * time.Millisecond,
		Jitter: func() float64 { j := jitters[i]; i++; return j }})

	r, err := c.CreateCheckout(ctx(t), "", buy)
	require.NoError(t, err)
	require.Equal(t, 6, r.Attempts)
	require.Equal(t, []time.Duration{100 * time.Millisecond, 199800 * time.Microsecond, 0, 300 * time.Millisecond, 75 * time.Millisecond}, s.waits,
		"ceilings 100ms, 200ms, then 300ms (capped)")
	require.Regexp(t, `^key_[0-9a-f]{32}$`, r.IdempotencyKey, "a key made by the client")
	for _, q := range f.requests() {
		require.Equal(t, r.IdempotencyKey, q.key, "the client's key on every attempt")
	}
}

// TestRetriesStopAtTheDeadline: a wait that would end after the context's
// deadline is not slept: the last answer comes back at once, marked as
// stopped by the deadline, with its Retry-After for the caller.
func TestRetriesStopAtTheDeadline(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, reply{status: 429, code: "rate_limited", retryAfter: "7200"})
	now := time.Now() // the context's deadline is on the real clock
	c, s := setup(t, f, client.RetryPolicy{Now: func() time.Time { return now }})
	dctx, cancel := context.WithDeadline(context.Background(), now.Add(time.Hour))
	defer cancel()

	_, err := c.CreateCheckout(dctx, "k-1", buy)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, 429, e.StatusCode)
	require.Equal(t, client.CodeRateLimited, e.Code)
	require.Equal(t, 2*time.Hour, e.RetryAfter)
	require.Equal(t, 1, e.Attempts)
	require.True(t, e.Temporary())
	require.Empty(t, s.waits, "no wait past the deadline")
}

// TestRetriesStopAtMaxAttempts and when the context is canceled during a
// wait.
func TestRetriesStopAtMaxAttemptsOrCancel(t *testing.T) {
	t.Parallel()
	t.Run("max attempts", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t, reply{drop: true})
		c, _ := setup(t, f, client.RetryPolicy{MaxAttempts: 3})
		_, err := c.CreateCheckout(ctx(t), "k-1", buy)
		require.ErrorIs(t, err, client.ErrTooManyAttempts)
		var e *client.Error
		require.ErrorAs(t, err, &e)
		require.Equal(t, 3, e.Attempts)
		require.Equal(t, 0, e.StatusCode)
		require.Error(t, e.Transport)
		require.Len(t, f.requests(), 3)
	})
	t.Run("canceled while waiting", func(t *testing.T) {
		t.Parallel()
		f := newFakeAPI(t, reply{status: 503, code: "unavailable"})
		cctx, cancel := context.WithCancel(context.Background())
		c, _ := setup(t, f, client.RetryPolicy{Sleep: func(ctx context.Context, _ time.Duration) error { cancel(); return ctx.Err() }})
		_, err := c.CreateCheckout(cctx, "k-1", buy)
		require.ErrorIs(t, err, context.Canceled)
		require.Len(t, f.requests(), 1)
	})
}

// TestEveryOperation: each method sends its route, key and body, and
// decodes its answer.
func TestEveryOperation(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, reply{status: 200, body: ""})
	c, _ := setup(t, f, client.RetryPolicy{})
	_, err := c.CancelOrder(ctx(t), "ord_1", "k-c")
	require.NoError(t, err)
	_, err = c.GetOrder(ctx(t), "ord_1")
	require.NoError(t, err)
	require.Equal(t, []seen{
		{"POST", "/v1/orders/ord_1/cancel", "k-c", "Bearer sk_test_acme", "{}"},
		{"GET", "/v1/orders/ord_1", "", "Bearer sk_test_acme", ""},
	}, f.requests())

	refunds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/v1/orders/ord_1/refunds":
			require.JSONEq(t, `{"amount":1500,"reason":"requested_by_customer"}`, string(b))
			w.WriteHeader(201)
			_, _ = io.WriteString(w, `{"id":"rf_1","order_id":"ord_1","amount":1500,"currency":"usd","reason":null,"status":"pending","stripe_refund_id":null,"created_at":"2026-12-02T18:00:00Z"}`)
		case "/v1/products":
			_, _ = io.WriteString(w, `{"data":[{"sku":"sku_tee","name":"Tee","unit_amount":2500,"currency":"usd","stock":9}]}`)
		}
	}))
	t.Cleanup(refunds.Close)
	c, err = client.New(refunds.URL+"/", "sk_test_acme")
	require.NoError(t, err)
	rf, err := c.CreateRefund(ctx(t), "ord_1", "", client.RefundRequest{Amount: 1500, Reason: client.ReasonRequestedByCustomer})
	require.NoError(t, err)
	require.Equal(t, client.Refund{ID: "rf_1", OrderID: "ord_1", Amount: 1500, Currency: "usd", Status: client.RefundPending,
		CreatedAt: time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC)}, rf.Refund)
	ps, err := c.ListProducts(ctx(t))
	require.NoError(t, err)
	require.Equal(t, []client.Product{{SKU: "sku_tee", Name: "Tee", UnitAmount: 2500, Currency: "usd", Stock: 9}}, ps.Products)
}

func TestNewRefusesBadArguments(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://"} {
		_, err := client.New(u, "k")
		require.Error(t, err, u)
	}
	_, err := client.New("http://127.0.0.1:8080", "")
	require.Error(t, err)
	require.False(t, errors.Is(err, client.ErrTooManyAttempts))
}
