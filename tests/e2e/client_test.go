package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/client"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// The scenarios of the public client package against the real binaries:
// the faults a client meets between it and the api (a gateway's 504, an
// answer lost on the way back, a 422, a 429), and what its retry policy
// makes of them, counted in orders and PaymentIntents at the emulator.

// attempts records what came back to each HTTP attempt of a client: the
// status (0: no answer) and the Retry-After header.
type attempts struct {
	mu     sync.Mutex
	status []int
	after  []string
	next   http.RoundTripper
}

func (a *attempts) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := a.next.RoundTrip(r)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.status = append(a.status, 0)
		a.after = append(a.after, "")
		return nil, err
	}
	a.status = append(a.status, resp.StatusCode)
	a.after = append(a.after, resp.Header.Get("Retry-After"))
	return resp, nil
}

func (a *attempts) statuses() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.status...)
}

// waits records the retry policy's waits, and waits them.
type waits struct {
	mu sync.Mutex
	ds []time.Duration
}

func (w *waits) sleep(ctx context.Context, d time.Duration) error {
	w.mu.Lock()
	w.ds = append(w.ds, d)
	w.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newAPIClient is a client of tenant acme at baseURL whose attempts and
// waits are recorded; its backoff starts at 50ms and is capped at 500ms.
func newAPIClient(t *testing.T, baseURL string) (*client.Client, *attempts, *waits) {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	a := &attempts{next: tr}
	w := &waits{}
	c, err := client.New(baseURL, "sk_test_acme", client.WithHTTPClient(&http.Client{Transport: a}),
		client.WithRetryPolicy(client.RetryPolicy{BaseDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond,
			AttemptTimeout: 20 * time.Second, Sleep: w.sleep}))
	require.NoError(t, err)
	return c, a, w
}

func teeCheckout(email string, n int) client.CheckoutRequest {
	return client.CheckoutRequest{Email: email, Items: []client.Item{{SKU: "sku_tee", Quantity: n}}, PaymentMethod: "pm_card_visa"}
}

// requireOneOrderOneCharge asserts the end state of one purchase: one
// order in the database, the result's, paid, one PaymentIntent at the
// emulator (it moved money), one email.
func requireOneOrderOneCharge(t *testing.T, s *stack.Stack, r *client.OrderResult) {
	t.Helper()
	require.Equal(t, 1, s.Orders(), "orders")
	pis := s.PaymentIntents()
	require.Len(t, pis, 1, "PaymentIntents at the emulator")
	require.Equal(t, r.Order.ID, pis[0].Metadata["order_id"])
	require.Equal(t, 1, stack.MoneyMoving(pis))
	requireOnce(t, s, r.IdempotencyKey, &stack.Order{ID: r.Order.ID})
}

// TestClientRetriesGatewayTimeout: Stripe is slow, the gateway answers
// 504 while the api goes on and charges. The client retries the same key
// (409 in use while it runs, then the stored 201): one order, one charge.
// A client that made a key per attempt would get a second order and a
// second PaymentIntent (TestNewKeyPerRetryChargesTwice).
func TestClientRetriesGatewayTimeout(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{GatewayTimeout: time.Second})
	ctx := testCtx(t, 60*time.Second)
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, After: 2500 * time.Millisecond})
	c, a, _ := newAPIClient(t, s.Gateway.URL)

	r, err := c.CreateCheckout(ctx, "", teeCheckout("gw@example.com", 2))
	require.NoError(t, err)
	require.Equal(t, 504, a.statuses()[0], "the first attempt timed out at the gateway")
	require.Equal(t, 1, s.Gateway.Timeouts())
	require.Equal(t, 201, r.StatusCode)
	require.Equal(t, client.OrderPaid, r.Order.Status)
	require.True(t, r.Replayed, "the 201 is the one the first attempt stored")
	require.Equal(t, len(a.statuses()), r.Attempts)
	require.GreaterOrEqual(t, r.Attempts, 2)
	requireOneOrderOneCharge(t, s, r)
}

// TestClientRetriesDroppedAnswer: the api answers, but the connection is
// reset on the way back (a toxiproxy link in front of the api), until the
// test has seen the key finished. The client retries the same key and gets
// the stored 201: one order, one charge.
func TestClientRetriesDroppedAnswer(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{})
	ctx := testCtx(t, 60*time.Second)
	apiAddr, err := stack.HostPort(s.APIURL)
	require.NoError(t, err)
	p, err := s.AddProxy("client-api", apiAddr)
	require.NoError(t, err)
	require.NoError(t, p.DropAnswers())
	c, a, _ := newAPIClient(t, "http://"+p.Addr())
	key := client.NewKey()

	done := async(func() error {
		_, err := c.CreateCheckout(ctx, key, teeCheckout("drop@example.com", 1))
		return err
	})
	eventually(t, 20*time.Second, func() bool {
		k, ok := s.Key(key)
		return ok && k.RecoveryPoint == "finished" && len(a.statuses()) >= 1
	}, "the api finished the checkout whose answer was dropped")
	p.Heal()
	require.NoError(t, done())

	r, err := c.GetOrder(ctx, mustKeyOrder(t, s, key))
	require.NoError(t, err)
	require.Equal(t, 0, a.statuses()[0], "the first attempt got no answer")
	last := a.statuses()[len(a.statuses())-2] // before GetOrder's 200
	require.Equal(t, 201, last)
	requireOneOrderOneCharge(t, s, &client.OrderResult{Order: r.Order, Call: client.Call{IdempotencyKey: key}})
}

// mustKeyOrder returns the order of checkout key key.
func mustKeyOrder(t *testing.T, s *stack.Stack, key string) string {
	t.Helper()
	k, ok := s.Key(key)
	require.True(t, ok)
	require.NotEmpty(t, k.OrderID)
	return k.OrderID
}

// countingProxy forwards to upstream and counts the requests.
func countingProxy(t *testing.T, upstream string) (string, *atomic.Int64) {
	t.Helper()
	u, err := url.Parse(upstream)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

// TestClientReturnsKeyReusedAtOnce: the same key with another body is
// 422 idempotency_key_reused, a final answer: one attempt, no wait, and
// nothing executed (still one order).
func TestClientReturnsKeyReusedAtOnce(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{NoBackground: true})
	ctx := testCtx(t, 30*time.Second)
	base, requests := countingProxy(t, s.APIURL)
	c, _, w := newAPIClient(t, base)

	first, err := c.CreateCheckout(ctx, "", teeCheckout("reuse@example.com", 1))
	require.NoError(t, err)
	require.Equal(t, 1, first.Attempts)
	require.False(t, first.Replayed)

	_, err = c.CreateCheckout(ctx, first.IdempotencyKey, teeCheckout("reuse@example.com", 3))
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, 422, e.StatusCode)
	require.Equal(t, client.CodeIdempotencyKeyReused, e.Code)
	require.Equal(t, 1, e.Attempts)
	require.Nil(t, e.Stopped)
	require.False(t, e.Temporary())
	require.Equal(t, int64(2), requests.Load(), "one request per call")
	require.Empty(t, w.ds, "no wait")
	require.Equal(t, 1, s.Orders())
	require.Len(t, s.PaymentIntents(), 1)
}

// TestClientWaitsOutRateLimit: with RATE_LIMIT=1/s (bursts of 2) the
// tenant's budget is spent, so the checkout's first attempt is 429 with
// Retry-After; the client waits at least that long, once, and the second
// attempt is the 201.
func TestClientWaitsOutRateLimit(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{NoBackground: true, Env: map[string]map[string]string{"api": {"RATE_LIMIT": "1/s"}}})
	ctx := testCtx(t, 30*time.Second)
	spend, err := client.New(s.APIURL, "sk_test_acme", client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	for {
		_, err := spend.ListProducts(ctx)
		if client.IsCode(err, client.CodeRateLimited) {
			break
		}
		require.NoError(t, err)
	}
	c, a, w := newAPIClient(t, s.APIURL)

	r, err := c.CreateCheckout(ctx, "", teeCheckout("limit@example.com", 1))
	require.NoError(t, err)
	require.Equal(t, []int{429, 201}, a.statuses())
	retryAfter, err := strconv.Atoi(a.after[0])
	require.NoError(t, err, "Retry-After of the 429")
	require.GreaterOrEqual(t, retryAfter, 1)
	require.Len(t, w.ds, 1)
	require.GreaterOrEqual(t, w.ds[0], time.Duration(retryAfter)*time.Second, "waited at least Retry-After")
	require.Equal(t, 2, r.Attempts)
	require.False(t, r.Replayed)
	require.Equal(t, 1, s.Orders())
	require.Len(t, s.PaymentIntents(), 1)
}

// TestClientWaitOrderFollowsA3DSecureOrder: a checkout with a card that
// asks for 3D Secure answers 202 requires_action; the customer passes the
// challenge at the emulator, and WaitOrder follows the order until the
// webhook has made it paid: one order, one charge, one email. A declined
// card is errors.Is ErrPaymentDeclined, with the api's request id.
func TestClientWaitOrderFollowsA3DSecureOrder(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{})
	ctx := testCtx(t, 60*time.Second)
	c, _, _ := newAPIClient(t, s.APIURL)

	req := teeCheckout("wait@example.com", 1)
	req.PaymentMethod = "pm_card_authenticationRequired"
	r, err := c.CreateCheckout(ctx, "", req)
	require.NoError(t, err)
	require.Equal(t, 202, r.StatusCode)
	require.Equal(t, client.OrderRequiresAction, r.Order.Status)
	require.NotEmpty(t, r.RequestID, "the api's X-Request-Id")

	s.Authenticate(r.Order.Payment.PaymentIntentID, true)
	settled, err := c.WaitOrder(ctx, r.Order.ID)
	require.NoError(t, err)
	require.Equal(t, client.OrderPaid, settled.Order.Status)
	requireOnce(t, s, r.IdempotencyKey, &stack.Order{ID: r.Order.ID})

	req = teeCheckout("declined@example.com", 1)
	req.PaymentMethod = "pm_card_chargeDeclined"
	_, err = c.CreateCheckout(ctx, "", req)
	require.ErrorIs(t, err, client.ErrPaymentDeclined)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, client.CodeCardDeclined, e.Code)
	require.NotEmpty(t, e.RequestID)
	require.Equal(t, "payment_failed", s.OrderStatus(e.OrderID))
}
