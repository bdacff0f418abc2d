package webhooks_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76/webhook"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	lifecycle "github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/webhooks"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

const secret = "whsec_test_checkout"

// orders holds dbOrders' knob: failNext makes the next apply fail after its
// own writes, as a connection cut mid-transaction would.
type orders struct {
	failNext atomic.Bool
}

// dbOrders is a minimal Orders over the real orders table: forward-only
// transitions out of pending_payment, each with an outbox event, as the
// saga's ApplyPaymentIntent does. The API's tests run the real one.
type dbOrders struct {
	*orders
	db *gorm.DB
}

func (o dbOrders) OrderStatus(ctx context.Context, tenantID, orderID string) (lifecycle.Status, error) {
	var status []string
	if err := o.db.WithContext(ctx).Raw(`SELECT status FROM orders WHERE id = ? AND tenant_id = ?`, orderID, tenantID).Scan(&status).Error; err != nil {
		return "", err
	}
	if len(status) == 0 {
		return "", fmt.Errorf("order %s: %w", orderID, webhooks.ErrNotOurs)
	}
	return lifecycle.Status(status[0]), nil
}

// CloseBeforeExit returns pi as it is: this fake has no Stripe to cancel
// at (the API's tests cover the saga's closing).
func (o dbOrders) CloseBeforeExit(_ context.Context, pi webhooks.PaymentIntent) (webhooks.PaymentIntent, error) {
	return pi, nil
}

// SettleStrayPayment does nothing: this fake has no Stripe to refund at
// (the API's tests cover stray payments).
func (o dbOrders) SettleStrayPayment(context.Context, webhooks.PaymentIntent) error { return nil }

func (o dbOrders) ApplyPaymentIntent(ctx context.Context, tx *gorm.DB, pi webhooks.PaymentIntent) (bool, error) {
	var target, typ string
	switch pi.Status {
	case "succeeded":
		target, typ = "paid", outbox.TypeOrderPaid
	case "requires_payment_method", "canceled":
		target, typ = "payment_failed", outbox.TypeOrderPaymentFailed
	default:
		return false, nil
	}
	var n int64
	if err := tx.Raw(`SELECT count(*) FROM orders WHERE id = ? AND tenant_id = ?`, pi.OrderID, pi.TenantID).Scan(&n).Error; err != nil {
		return false, err
	}
	if n == 0 {
		return false, fmt.Errorf("order %s: %w", pi.OrderID, webhooks.ErrNotOurs)
	}
	res := tx.Exec(`UPDATE orders SET status = ?, payment_intent_id = ?, payment_status = ?, updated_at = now()
		WHERE id = ? AND status = 'pending_payment'`, target, pi.ID, pi.Status, pi.OrderID)
	if res.Error != nil {
		return false, res.Error
	}
	if res.RowsAffected == 0 {
		return false, nil
	}
	if err := outbox.Add(ctx, tx, outbox.Event{Type: typ, OccurredAt: time.Now(), TenantID: pi.TenantID, AggregateID: pi.OrderID,
		Data: map[string]string{"id": pi.OrderID}}); err != nil {
		return false, err
	}
	if o.failNext.CompareAndSwap(true, false) {
		return false, errors.New("connection reset by peer")
	}
	return true, nil
}

// intents is Stripe's current state of each PaymentIntent, as GET
// /v1/payment_intents/{id} would answer.
type intents struct {
	mu    sync.Mutex
	state map[string]webhooks.PaymentIntent
	calls atomic.Int64
}

func (s *intents) RetrievePaymentIntent(_ context.Context, id string) (webhooks.PaymentIntent, error) {
	s.calls.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	pi, ok := s.state[id]
	if !ok {
		return webhooks.PaymentIntent{}, fmt.Errorf("no such payment intent %s", id)
	}
	return pi, nil
}

func (s *intents) set(pi webhooks.PaymentIntent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state[pi.ID] = pi
}

type bundle struct {
	t       *testing.T
	db      *gorm.DB
	orders  dbOrders
	stripe  *intents
	reg     *prometheus.Registry
	handler *webhooks.Handler
	srv     *httptest.Server
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db, _ := pgtest.NewDB(t)
	b := &bundle{t: t, db: db, orders: dbOrders{&orders{}, db}, stripe: &intents{state: map[string]webhooks.PaymentIntent{}}, reg: prometheus.NewRegistry()}
	b.handler = &webhooks.Handler{
		DB:       db,
		Verifier: webhooks.Verifier{Secret: secret},
		Orders:   b.orders,
		Stripe:   b.stripe,
		Metrics:  webhooks.NewMetrics(b.reg),
	}
	b.srv = httptest.NewServer(b.handler)
	t.Cleanup(b.srv.Close)
	return b
}

// order inserts a pending_payment order of tenant acme and returns its id.
func (b *bundle) order() string {
	b.t.Helper()
	id := ids.New("ord")
	require.NoError(b.t, b.db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES (?, 'acme', 'pending_payment', 'buyer@example.com', 'usd', 2500, 'pm_card_visa', now(), now())`, id).Error)
	return id
}

func (b *bundle) status(orderID string) string {
	b.t.Helper()
	var s string
	require.NoError(b.t, b.db.Raw(`SELECT status FROM orders WHERE id = ?`, orderID).Scan(&s).Error)
	return s
}

func (b *bundle) count(q string, args ...any) int {
	b.t.Helper()
	var n int64
	require.NoError(b.t, b.db.Raw(q, args...).Scan(&n).Error)
	return int(n)
}

func (b *bundle) outcome(typ, outcome string) int {
	return int(testutil.ToFloat64(counter{b.reg, typ, outcome}))
}

// counter is one series of checkout_stripe_webhooks_total as a Collector.
type counter struct {
	reg           *prometheus.Registry
	typ, outcome_ string
}

func (c counter) Describe(chan<- *prometheus.Desc) {}
func (c counter) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := c.reg.Gather()
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "checkout_stripe_webhooks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["type"] == c.typ && l["outcome"] == c.outcome_ {
				v = m.GetCounter().GetValue()
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("x", "", nil, nil), prometheus.CounterValue, v)
}

// event returns a Stripe event of typ about pi, rendered as Stripe does
// (indented JSON).
func event(id, typ string, pi webhooks.PaymentIntent, apiVersion string) []byte {
	obj := map[string]any{"id": pi.ID, "object": "payment_intent", "status": pi.Status, "amount": 2500, "currency": "usd",
		"metadata": map[string]string{"order_id": pi.OrderID, "tenant_id": pi.TenantID}}
	b, _ := json.MarshalIndent(map[string]any{"id": id, "object": "event", "type": typ, "api_version": apiVersion,
		"created": time.Now().Unix(), "livemode": false, "pending_webhooks": 1,
		"request": map[string]any{"id": nil, "idempotency_key": nil},
		"data":    map[string]any{"object": obj}}, "", "  ")
	return b
}

func signature(body []byte, at time.Time) string {
	return fmt.Sprintf("t=%d,v1=%s", at.Unix(), hex.EncodeToString(webhook.ComputeSignature(at, body, secret)))
}

type reply struct {
	status int
	body   string
}

func (b *bundle) deliver(body []byte, sig string) reply {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL, bytes.NewReader(body))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	if sig != "" {
		req.Header.Set("Stripe-Signature", sig)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return reply{resp.StatusCode, string(got)}
}

func (b *bundle) send(body []byte) reply {
	b.t.Helper()
	return b.deliver(body, signature(body, time.Now()))
}

func received(outcome string) string {
	return `{"received":true,"outcome":"` + outcome + `"}` + "\n"
}

func TestSignature(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ord := b.order()
	pi := webhooks.PaymentIntent{ID: "pi_sig", Status: "succeeded", OrderID: ord, TenantID: "acme"}
	body := event("evt_sig", webhooks.TypePaymentIntentSucceeded, pi, "2023-10-16")

	var generic map[string]any
	require.NoError(t, json.Unmarshal(body, &generic))
	reencoded, err := json.Marshal(generic) // the same JSON, compacted by a framework's binding
	require.NoError(t, err)
	require.NotEqual(t, body, reencoded)

	for _, tc := range []struct {
		name string
		body []byte
		sig  string
	}{
		{"the same JSON re-encoded", reencoded, signature(body, time.Now())},
		{"signed over the re-encoded JSON with another secret", reencoded, "t=1,v1=00"},
		{"no signature", body, ""},
		{"timestamp older than 300s", body, signature(body, time.Now().Add(-301*time.Second))},
	} {
		r := b.deliver(tc.body, tc.sig)
		require.Equal(t, http.StatusBadRequest, r.status, tc.name)
		require.Contains(t, r.body, `"code":"invalid_signature"`, tc.name)
		require.Equal(t, "pending_payment", b.status(ord), "%s: nothing changes", tc.name)
		require.Zero(t, b.count(`SELECT count(*) FROM inbox`), tc.name)
	}
	require.Equal(t, 4, b.outcome("unverified", webhooks.OutcomeInvalidSignature))

	r := b.deliver(body, signature(body, time.Now().Add(-290*time.Second)))
	require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, r, "exact bytes, 290s old")
	require.Equal(t, "paid", b.status(ord))
	require.Equal(t, 1, b.outcome(webhooks.TypePaymentIntentSucceeded, webhooks.OutcomeApplied))
}

func TestOtherAPIVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ord := b.order()
	// A 2015 rendering: request is a bare string (stripe-go v76 cannot decode
	// that into its Event), plus fields nobody knows.
	body := []byte(`{"id":"evt_v2015","object":"event","type":"payment_intent.succeeded","api_version":"2015-10-16",
		"request":"req_abc","created":1450000000,"unknown_top":{"x":1},
		"data":{"object":{"id":"pi_v2015","object":"payment_intent","status":"succeeded","amount":2500,
		"metadata":{"order_id":"` + ord + `","tenant_id":"acme"},"charges":{"object":"list","data":[]},"brand_new":[1]}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(body))
	require.Equal(t, "paid", b.status(ord))
}

func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ord := b.order()
	body := event("evt_dup", webhooks.TypePaymentIntentSucceeded,
		webhooks.PaymentIntent{ID: "pi_dup", Status: "succeeded", OrderID: ord, TenantID: "acme"}, "2023-10-16")
	const n = 20
	var wg sync.WaitGroup
	replies := make([]reply, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = b.send(body)
		}()
	}
	wg.Wait()
	outcomes := map[string]int{}
	for _, r := range replies {
		require.Equal(t, 200, r.status)
		var got struct{ Outcome string }
		require.NoError(t, json.Unmarshal([]byte(r.body), &got))
		outcomes[got.Outcome]++
	}
	require.Equal(t, map[string]int{webhooks.OutcomeApplied: 1, webhooks.OutcomeDuplicate: n - 1}, outcomes)
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = ?`, ord, outbox.TypeOrderPaid))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook' AND message_id = 'evt_dup'`))

	// And once more, sequentially.
	require.Equal(t, reply{200, received(webhooks.OutcomeDuplicate)}, b.send(body))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ?`, ord))
}

// TestFailureAfterInboxInsert: the apply fails after the inbox row (and the
// order's own update) were written in the transaction: 503, nothing is
// recorded, and the redelivery applies it once.
func TestFailureAfterInboxInsert(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ord := b.order()
	body := event("evt_fail", webhooks.TypePaymentIntentSucceeded,
		webhooks.PaymentIntent{ID: "pi_fail", Status: "succeeded", OrderID: ord, TenantID: "acme"}, "2023-10-16")
	b.orders.failNext.Store(true)
	r := b.send(body)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Contains(t, r.body, `"code":"unavailable"`)
	require.Zero(t, b.count(`SELECT count(*) FROM inbox`), "the inbox record is rolled back with the change")
	require.Equal(t, "pending_payment", b.status(ord))
	require.Zero(t, b.count(`SELECT count(*) FROM outbox`))
	require.Equal(t, 1, b.outcome(webhooks.TypePaymentIntentSucceeded, webhooks.OutcomeError))

	require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(body), "Stripe's resend")
	require.Equal(t, "paid", b.status(ord))
	require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox`))
	require.Equal(t, reply{200, received(webhooks.OutcomeDuplicate)}, b.send(body))
}

// TestDatabaseDown: the inbox cannot be written: 503 so that Stripe resends.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ord := b.order()
	db, _ := pgtest.NewDB(t)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	require.NoError(t, sqlDB.Close())
	h := *b.handler
	h.DB = db
	srv := httptest.NewServer(&h)
	t.Cleanup(srv.Close)

	body := event("evt_down", webhooks.TypePaymentIntentSucceeded,
		webhooks.PaymentIntent{ID: "pi_down", Status: "succeeded", OrderID: ord, TenantID: "acme"}, "2023-10-16")
	req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
	req.Header.Set("Stripe-Signature", signature(body, time.Now()))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, string(got))
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	require.Equal(t, "pending_payment", b.status(ord))
}

// TestOutOfOrder: Stripe's current state wins whatever order the events
// arrive in. The PaymentIntent first failed (payment_failed), then a later
// confirmation succeeded.
func TestOutOfOrder(t *testing.T) {
	t.Parallel()
	failedThenSucceeded := func(b *bundle) (ord string, failed, succeeded []byte) {
		ord = b.order()
		pi := webhooks.PaymentIntent{ID: "pi_" + ord[4:20], OrderID: ord, TenantID: "acme"}
		older, newer := pi, pi
		older.Status, newer.Status = "requires_payment_method", "succeeded"
		b.stripe.set(newer) // what GET /v1/payment_intents/{id} says now
		return ord, event("evt_f_"+ord, webhooks.TypePaymentIntentPaymentFailed, older, "2023-10-16"),
			event("evt_s_"+ord, webhooks.TypePaymentIntentSucceeded, newer, "2023-10-16")
	}

	t.Run("payment_failed delivered after succeeded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ord, failed, succeeded := failedThenSucceeded(b)
		require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(succeeded))
		require.Equal(t, reply{200, received(webhooks.OutcomeStale)}, b.send(failed))
		require.Equal(t, "paid", b.status(ord))
		require.Zero(t, b.stripe.calls.Load(), "a settled order needs no look at Stripe")
	})
	t.Run("payment_failed delivered first, Stripe says succeeded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ord, failed, succeeded := failedThenSucceeded(b)
		require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(failed))
		require.Equal(t, "paid", b.status(ord), "the handler applied Stripe's current state, not the event's")
		require.Equal(t, int64(1), b.stripe.calls.Load())
		require.Equal(t, reply{200, received(webhooks.OutcomeStale)}, b.send(succeeded))
		require.Equal(t, "paid", b.status(ord))
		require.Equal(t, 1, b.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ?`, ord))
	})
	t.Run("Stripe unreachable for the check", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ord := b.order()
		body := event("evt_unreach", webhooks.TypePaymentIntentPaymentFailed,
			webhooks.PaymentIntent{ID: "pi_unknown_to_stripe", Status: "requires_payment_method", OrderID: ord, TenantID: "acme"}, "2023-10-16")
		r := b.send(body)
		require.Equal(t, http.StatusBadGateway, r.status)
		require.Contains(t, r.body, `"code":"payment_provider_unavailable"`)
		require.Equal(t, "pending_payment", b.status(ord))
		require.Zero(t, b.count(`SELECT count(*) FROM inbox`))
	})
}

func TestIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ord := b.order()
	for _, tc := range []struct {
		name string
		body []byte
		typ  string
	}{
		{"a type not handled", event("evt_i1", "customer.created", webhooks.PaymentIntent{ID: "pi_1", OrderID: ord, TenantID: "acme"}, "2023-10-16"), "other"},
		{"no metadata", event("evt_i2", webhooks.TypePaymentIntentSucceeded, webhooks.PaymentIntent{ID: "pi_2", Status: "succeeded"}, "2023-10-16"), webhooks.TypePaymentIntentSucceeded},
		{"an unknown order", event("evt_i3", webhooks.TypePaymentIntentSucceeded, webhooks.PaymentIntent{ID: "pi_3", Status: "succeeded", OrderID: ids.New("ord"), TenantID: "acme"}, "2023-10-16"), webhooks.TypePaymentIntentSucceeded},
		{"another tenant's order", event("evt_i4", webhooks.TypePaymentIntentPaymentFailed, webhooks.PaymentIntent{ID: "pi_4", Status: "requires_payment_method", OrderID: ord, TenantID: "globex"}, "2023-10-16"), webhooks.TypePaymentIntentPaymentFailed},
		{"requires_action is informational", event("evt_i5", webhooks.TypePaymentIntentRequiresAction, webhooks.PaymentIntent{ID: "pi_5", Status: "requires_action", OrderID: ord, TenantID: "acme"}, "2023-10-16"), webhooks.TypePaymentIntentRequiresAction},
		{"refunds not wired", []byte(`{"id":"evt_i6","type":"refund.updated","data":{"object":{"id":"re_1","object":"refund","status":"succeeded","metadata":{"order_id":"` + ord + `","tenant_id":"acme"}}}}`), webhooks.TypeRefundUpdated},
	} {
		require.Equal(t, reply{200, received(webhooks.OutcomeIgnored)}, b.send(tc.body), tc.name)
		require.Equal(t, "pending_payment", b.status(ord), tc.name)
	}
	require.Zero(t, b.count(`SELECT count(*) FROM inbox`))
	require.Equal(t, 1, b.outcome("other", webhooks.OutcomeIgnored), "unhandled types share one label value")
	require.Equal(t, 2, b.outcome(webhooks.TypePaymentIntentSucceeded, webhooks.OutcomeIgnored))
}

func TestBodyLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big := []byte(`{"id":"evt_big","type":"x","data":{"object":{"pad":"` + strings.Repeat("a", webhooks.DefaultMaxBodyBytes) + `"}}}`)
	r := b.send(big)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	require.Contains(t, r.body, `"code":"payload_too_large"`)

	// Declared too large and only begun: answered at once, and the
	// connection closes (net/http would otherwise read the rest of a
	// remainder under 256 KiB, which a limit below that allows, before it
	// wrote the 413).
	h := *b.handler
	h.MaxBodyBytes = 1 << 10
	srv := httptest.NewServer(&h)
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"", 2*h.MaxBodyBytes)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "an answer before the rest of the body")
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.True(t, resp.Close, "the connection closes: the rest of the body is never read")

	// Signed, but not an event: 400 malformed_event.
	r = b.send([]byte(`{"hello":"world"}`))
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Contains(t, r.body, `"code":"malformed_event"`)
}

// refundsLog is a Refunds over a real table of its own: one row per
// refund, its status moved only from pending. RefundsOf answers from
// listed (a PaymentIntent's refunds at Stripe), and fails for "pi_down".
type refundsLog struct {
	known  map[string]bool
	listed map[string][]webhooks.Refund
	lists  *atomic.Int32 // RefundsOf calls
}

func (l refundsLog) RefundsOf(_ context.Context, pi string) ([]webhooks.Refund, error) {
	l.lists.Add(1)
	if pi == "pi_down" {
		return nil, errors.New("stripe: connection refused")
	}
	return l.listed[pi], nil
}

func (l refundsLog) ApplyRefund(ctx context.Context, tx *gorm.DB, r webhooks.Refund) (bool, error) {
	if !l.known[r.ID] {
		return false, fmt.Errorf("refund %s: %w", r.ID, webhooks.ErrNotOurs)
	}
	res := tx.WithContext(ctx).Exec(`INSERT INTO test_refunds (id, status) VALUES (?, ?)
		ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status WHERE test_refunds.status = 'pending'`, r.ID, r.Status)
	return res.RowsAffected == 1, res.Error
}

// TestRefundEvents: with a Refunds wired, refund.updated, refund.failed and
// charge.refunded (whose charge embeds its refunds in older API versions,
// and whose PaymentIntent's refunds are listed at Stripe in later ones)
// are applied once each, in the inbox's transaction; refunds not ours are
// ignored.
func TestRefundEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.db.Exec(`CREATE TABLE test_refunds (id text PRIMARY KEY, status text NOT NULL)`).Error)
	lists := &atomic.Int32{}
	b.handler.Refunds = refundsLog{known: map[string]bool{"re_1": true, "re_2": true, "re_3": true}, lists: lists,
		listed: map[string][]webhooks.Refund{
			"pi_1":     {{ID: "re_3", Status: "succeeded", RefundID: "rf_3"}, {ID: "re_other", Status: "succeeded"}},
			"pi_other": {{ID: "re_x", Status: "succeeded"}},
		}}
	meta := `"metadata":{"refund_id":"rf_1","order_id":"ord_x","tenant_id":"acme"}`

	pending := []byte(`{"id":"evt_r0","type":"refund.updated","data":{"object":{"id":"re_1","object":"refund","status":"pending","amount":500,` + meta + `}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(pending))
	succeeded := []byte(`{"id":"evt_r1","type":"refund.updated","data":{"object":{"id":"re_1","object":"refund","status":"succeeded","amount":500,` + meta + `}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(succeeded))
	require.Equal(t, reply{200, received(webhooks.OutcomeDuplicate)}, b.send(succeeded))
	failedLate := []byte(`{"id":"evt_r2","type":"refund.failed","data":{"object":{"id":"re_1","object":"refund","status":"pending",` + meta + `}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeStale)}, b.send(failedLate), "an older state changes nothing")

	charge := []byte(`{"id":"evt_r3","type":"charge.refunded","api_version":"2020-08-27","data":{"object":{"id":"ch_1","object":"charge",
		"refunds":{"object":"list","data":[{"id":"re_2","object":"refund","status":"succeeded",` + meta + `}]}}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(charge))
	require.Equal(t, 2, b.count(`SELECT count(*) FROM test_refunds WHERE status = 'succeeded'`))

	notOurs := []byte(`{"id":"evt_r4","type":"refund.updated","data":{"object":{"id":"re_9","object":"refund","status":"succeeded",` + meta + `}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeIgnored)}, b.send(notOurs))
	noMeta := []byte(`{"id":"evt_r5","type":"refund.updated","data":{"object":{"id":"re_1","object":"refund","status":"failed","metadata":{}}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeIgnored)}, b.send(noMeta))
	noPI := []byte(`{"id":"evt_r6","type":"charge.refunded","api_version":"2023-10-16","data":{"object":{"id":"ch_2","object":"charge"}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeIgnored)}, b.send(noPI), "no embedded refunds and no PaymentIntent")
	require.Zero(t, lists.Load())

	// Since 2022-11-15 a charge embeds no refunds: the PaymentIntent's are
	// listed at Stripe, ours applied (re_3), the rest left alone.
	newCharge := []byte(`{"id":"evt_r7","type":"charge.refunded","api_version":"2023-10-16","data":{"object":{"id":"ch_3","object":"charge","payment_intent":"pi_1"}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(newCharge))
	require.Equal(t, 3, b.count(`SELECT count(*) FROM test_refunds WHERE status = 'succeeded'`))
	require.Equal(t, reply{200, received(webhooks.OutcomeDuplicate)}, b.send(newCharge))
	require.EqualValues(t, 1, lists.Load(), "a redelivery is answered from the inbox, without asking Stripe")
	foreign := []byte(`{"id":"evt_r8","type":"charge.refunded","api_version":"2023-10-16","data":{"object":{"id":"ch_4","object":"charge","payment_intent":"pi_other"}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeIgnored)}, b.send(foreign), "refunds none of ours")

	// Stripe does not answer the list: 502, nothing recorded, Stripe resends.
	down := []byte(`{"id":"evt_r9","type":"charge.refunded","api_version":"2023-10-16","data":{"object":{"id":"ch_5","object":"charge","payment_intent":"pi_down"}}}`)
	r := b.send(down)
	require.Equal(t, http.StatusBadGateway, r.status, r.body)
	require.Contains(t, r.body, `"code":"payment_provider_unavailable"`)
	require.Zero(t, b.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook' AND message_id = 'evt_r9'`))
	require.Equal(t, 5, b.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook'`))
}

// outsideRefunds is a Refunds that applies any refund naming an order
// through its PaymentIntent (IntentOrderID) or its own metadata, and
// records what it was given.
type outsideRefunds struct {
	mu    sync.Mutex
	given []webhooks.Refund
}

func (o *outsideRefunds) RefundsOf(context.Context, string) ([]webhooks.Refund, error) {
	return nil, nil
}

func (o *outsideRefunds) ApplyRefund(_ context.Context, _ *gorm.DB, r webhooks.Refund) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.given = append(o.given, r)
	if r.IntentOrderID == "" || r.OrderID != "" {
		return false, fmt.Errorf("refund %s: %w", r.ID, webhooks.ErrNotOurs)
	}
	return true, nil
}

// strayOrders is dbOrders that records the PaymentIntents it is asked to
// settle as stray payments.
type strayOrders struct {
	dbOrders
	mu      sync.Mutex
	settled []string
}

func (o *strayOrders) SettleStrayPayment(_ context.Context, pi webhooks.PaymentIntent) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.settled = append(o.settled, pi.ID)
	return nil
}

// TestRefundMadeOutside (CONTRACT.md v4): a refund made in Stripe's
// Dashboard carries none of our metadata; the handler reads the order its
// PaymentIntent names from Stripe (once: a redelivery is answered from
// the inbox) and hands it to Refunds (refund.created, as Stripe sends it).
// A PaymentIntent that names no order is ignored; Stripe not answering is
// a 502 with nothing recorded. A stray payment's refund (our order
// metadata, no refund of ours) that Stripe failed is settled as a stray
// payment again, before the event is recorded.
func TestRefundMadeOutside(t *testing.T) {
	t.Parallel()
	b := setup(t)
	refs := &outsideRefunds{}
	b.handler.Refunds = refs
	stray := &strayOrders{dbOrders: b.orders}
	b.handler.Orders = stray
	b.stripe.set(webhooks.PaymentIntent{ID: "pi_dash", Status: "succeeded", Amount: 5500, OrderID: "ord_d", TenantID: "acme"})
	b.stripe.set(webhooks.PaymentIntent{ID: "pi_foreign", Status: "succeeded", Amount: 900})
	b.stripe.set(webhooks.PaymentIntent{ID: "pi_stray", Status: "succeeded", Amount: 5000, OrderID: "ord_s", TenantID: "acme"})

	created := []byte(`{"id":"evt_o1","type":"refund.created","data":{"object":{"id":"re_d","object":"refund","status":"succeeded",
		"amount":1000,"reason":"requested_by_customer","payment_intent":"pi_dash","metadata":{}}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeApplied)}, b.send(created))
	require.Equal(t, reply{200, received(webhooks.OutcomeDuplicate)}, b.send(created))
	require.EqualValues(t, 1, b.stripe.calls.Load(), "the PaymentIntent read once")
	require.Len(t, refs.given, 1)
	require.Equal(t, "ord_d", refs.given[0].IntentOrderID)
	require.Equal(t, "acme", refs.given[0].IntentTenantID)
	require.Equal(t, "requested_by_customer", refs.given[0].Reason)

	foreign := []byte(`{"id":"evt_o2","type":"refund.created","data":{"object":{"id":"re_f","object":"refund","status":"succeeded",
		"amount":900,"payment_intent":"pi_foreign","metadata":{}}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeIgnored)}, b.send(foreign))

	down := []byte(`{"id":"evt_o3","type":"refund.created","data":{"object":{"id":"re_n","object":"refund","status":"succeeded",
		"amount":900,"payment_intent":"pi_unknown","metadata":{}}}}`)
	r := b.send(down)
	require.Equal(t, http.StatusBadGateway, r.status, r.body)
	require.Zero(t, b.count(`SELECT count(*) FROM inbox WHERE consumer = 'stripe_webhook' AND message_id = 'evt_o3'`))

	failed := []byte(`{"id":"evt_o4","type":"refund.failed","data":{"object":{"id":"re_s","object":"refund","status":"failed",
		"amount":5000,"payment_intent":"pi_stray","metadata":{"order_id":"ord_s","tenant_id":"acme"}}}}`)
	require.Equal(t, reply{200, received(webhooks.OutcomeIgnored)}, b.send(failed))
	require.Equal(t, []string{"pi_stray"}, stray.settled, "the stray payment's refund sent again")
}
