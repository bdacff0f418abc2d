package api_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/api"
	"github.com/onceonly/checkout/internal/auth"
	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/ratelimit"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/telemetry"
	"github.com/onceonly/checkout/internal/testenv"
)

func TestMain(m *testing.M) {
	// As cmd/api does; the tests that stop their Redis would otherwise
	// print a plain-text line per refused dial, burying a failure's output.
	redis.SetLogger(telemetry.RedisLogger(slog.New(slog.DiscardHandler)))
	goleak.VerifyTestMain(m,
		// pgx and go-redis pools keep background goroutines until closed;
		// httptest servers close their idle connections asynchronously.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		// go-redis probes a refused dial again every second and sees that
		// its pool was closed only after the sleep (tests that stop Redis).
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
	)
}

// options change what setup builds.
type options struct {
	failureMode idempotency.FailureMode
	lease       time.Duration
	ttl         time.Duration
	maxConns    int
	redisURL    string // "" = the shared Redis with a test prefix
	now         func() time.Time
	stripe      *payments.Config
	saga        checkout.SagaConfig
	// webhooks makes the emulator deliver its signed events to the API's
	// POST /v1/webhooks/stripe (off: events are only logged, and a test
	// delivers them itself with deliverEvent).
	webhooks bool
	// wrap, when set, wraps the Stripe client the API uses (to play
	// answers the emulator cannot give on its own); refunds keep the
	// real client.
	wrap func(checkout.PaymentProvider) checkout.PaymentProvider
	// refundRetryAfter is REFUND_RETRY_AFTER (0: the default).
	refundRetryAfter time.Duration
	rateLimits       ratelimit.Config // zero: no limit
	// logLevel is the services' log level (zero: debug, which tests read).
	logLevel slog.Level
}

// harness is one test's running API over its own database and Redis prefix,
// with its own Stripe emulator.
type harness struct {
	t        testing.TB
	db       *gorm.DB
	rdb      redis.UniversalClient
	prefix   string
	emu      *stripeemu.Emulator
	emuURL   string
	srv      *httptest.Server
	api      *api.API
	logs     *testenv.Output
	registry *registry
}

// registry wraps the API's Prometheus registry for counter lookups.
type registry struct{ *prometheus.Registry }

// requests returns the checkout_idempotency_requests_total series for
// outcome on the checkout route.
func (r *registry) requests(outcome string) prometheus.Collector {
	return gathered{r.Registry, "checkout_idempotency_requests_total", map[string]string{"route": "POST /v1/checkouts", "outcome": outcome}}
}

// gathered is one series of a registry (a counter's or a gauge's), as a
// Collector for testutil.ToFloat64.
type gathered struct {
	reg    *prometheus.Registry
	name   string
	labels map[string]string
}

func (g gathered) Describe(chan<- *prometheus.Desc) {}

func (g gathered) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != g.name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range g.labels {
				if have[k] != v {
					continue next
				}
			}
			v := m.GetCounter().GetValue()
			if m.Gauge != nil {
				v = m.GetGauge().GetValue()
			}
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.CounterValue, v)
			return
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.CounterValue, 0)
}

func setup(t testing.TB, opt ...func(*options)) *harness {
	t.Helper()
	o := options{failureMode: idempotency.FailClosed, lease: 5 * time.Second, ttl: 24 * time.Hour, logLevel: slog.LevelDebug}
	for _, f := range opt {
		f(&o)
	}
	h := &harness{t: t, logs: &testenv.Output{}}
	h.db, _ = pgtest.NewDB(t, pgtest.Options{MaxConns: o.maxConns})
	if o.redisURL == "" {
		h.rdb, h.prefix = testenv.Redis(t)
	} else {
		ro, err := redis.ParseURL(o.redisURL)
		require.NoError(t, err)
		ro.DialTimeout, ro.ReadTimeout, ro.WriteTimeout, ro.MaxRetries = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 0
		rdb := redis.NewClient(ro)
		t.Cleanup(func() { rdb.Close() })
		h.rdb, h.prefix = rdb, "test:"+testenv.Random(6)+":"
	}

	// The API's server is created (listening, not yet serving) first, so
	// that the emulator can be told where to send its webhooks.
	h.srv = httptest.NewUnstartedServer(nil)
	var emuOpts []stripeemu.Option
	if o.webhooks {
		emuOpts = append(emuOpts, stripeemu.WithWebhookURL("http://"+h.srv.Listener.Addr().String()+"/v1/webhooks/stripe"),
			stripeemu.WithWebhookRetry(50*time.Millisecond, 500*time.Millisecond, 30*time.Second))
	}
	h.emu = stripeemu.New(emuOpts...)
	emuSrv := httptest.NewServer(h.emu)
	t.Cleanup(emuSrv.Close)
	t.Cleanup(h.emu.Close)
	h.emuURL = emuSrv.URL

	logger := telemetry.NewLogger(h.logs, o.logLevel)
	keys, err := auth.ParseKeys(auth.DefaultKeys)
	require.NoError(t, err)
	stripeCfg := payments.Config{APIBase: emuSrv.URL, SecretKey: "sk_test_123", Timeout: 2 * time.Second, MaxElapsed: 3 * time.Second}
	if o.stripe != nil {
		stripeCfg = *o.stripe
		stripeCfg.APIBase, stripeCfg.SecretKey = emuSrv.URL, "sk_test_123"
	}
	client := payments.NewClient(stripeCfg, logger, nil)
	var pay checkout.PaymentProvider = client
	if o.wrap != nil {
		pay = o.wrap(pay)
	}
	reg := telemetry.NewRegistry()
	h.registry = &registry{reg}
	h.api = api.New(api.Config{
		RedisKeyPrefix:   h.prefix,
		TTL:              o.ttl,
		Lease:            o.lease,
		FailureMode:      o.failureMode,
		WorkTimeout:      30 * time.Second,
		Saga:             o.saga,
		RefundRetryAfter: o.refundRetryAfter,
		RateLimits:       o.rateLimits,
	}, api.Deps{DB: h.db, Redis: h.rdb, Payments: pay, Refunds: client, Keys: keys, Logger: logger, Registry: reg, Now: o.now})
	h.srv.Config.Handler = h.api.Handler
	h.srv.Start()
	t.Cleanup(h.srv.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service logs:\n%s", h.logs.String())
		}
	})
	return h
}

// reply is a response read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// checkout posts body to /v1/checkouts as tenant acme with key.
func (h *harness) checkout(key, body string) reply {
	h.t.Helper()
	return h.do(context.Background(), "sk_test_acme", key, body)
}

func (h *harness) do(ctx context.Context, apiKey, key, body string) reply {
	h.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/checkouts", bytes.NewBufferString(body))
	require.NoError(h.t, err)
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	return h.send(req)
}

func (h *harness) send(req *http.Request) reply {
	h.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	r := reply{status: resp.StatusCode, header: resp.Header, body: b}
	checkAgainstSpec(h.t, req, r) // every answer of every test follows api/openapi.yaml
	return r
}

func (h *harness) get(apiKey, path string) reply {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.srv.URL+path, nil)
	require.NoError(h.t, err)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	return h.send(req)
}

// count runs a COUNT(*) query.
func (h *harness) count(query string, args ...any) int {
	h.t.Helper()
	var n int64
	require.NoError(h.t, h.db.Raw(query, args...).Scan(&n).Error)
	return int(n)
}

func (h *harness) stock(sku string) int64 {
	h.t.Helper()
	var n int64
	require.NoError(h.t, h.db.Raw(`SELECT stock FROM products WHERE sku = ?`, sku).Scan(&n).Error)
	return n
}

// eventually polls cond every 20ms until it holds or 10s pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustRead(t testing.TB, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// intents returns the PaymentIntents of order id at the emulator, from its
// own state (not lagged like search).
func (h *harness) intents(orderID string) []*stripe.PaymentIntent {
	h.t.Helper()
	var out []*stripe.PaymentIntent
	for _, pi := range h.emu.PaymentIntents() {
		if pi.Metadata["order_id"] == orderID {
			out = append(out, pi)
		}
	}
	return out
}

// orderRow is what the invariant checks read of an order.
type orderRow struct {
	Status          string
	PaymentIntentID *string
	PaymentStatus   *string
}

func (h *harness) order(id string) orderRow {
	h.t.Helper()
	var o orderRow
	require.NoError(h.t, h.db.Raw(`SELECT status, payment_intent_id, payment_status FROM orders WHERE id = ?`, id).Scan(&o).Error)
	require.NotEmpty(h.t, o.Status, "order %s", id)
	return o
}

// requirePaymentInvariants checks CONTRACT.md's payment guarantees for one
// order against the emulator's own state: at most one PaymentIntent moves
// money; the order's status is Stripe's (paid exactly when its recorded
// PaymentIntent succeeded); every other PaymentIntent of the order is
// canceled; and Stripe never answered idempotency_error (a key sent again
// with other parameters): no 400 at all, except on the emulator ops listed
// in expected400 (e.g. a cancel Stripe refuses because the PaymentIntent
// succeeded). It returns the order's PaymentIntents.
func (h *harness) requirePaymentInvariants(orderID, wantStatus string, expected400 ...string) []*stripe.PaymentIntent {
	h.t.Helper()
	pis := h.intents(orderID)
	o := h.order(orderID)
	require.Equal(h.t, wantStatus, o.Status, "order %s", orderID)
	moving := 0
	for _, pi := range pis {
		if stripeintent.Status(pi.Status).MovesMoney() {
			moving++
		}
	}
	require.LessOrEqual(h.t, moving, 1, "money-moving PaymentIntents of order %s", orderID)
	var mine *stripe.PaymentIntent
	for _, pi := range pis {
		if o.PaymentIntentID != nil && pi.ID == *o.PaymentIntentID {
			mine = pi
			continue
		}
		require.Equal(h.t, stripe.PaymentIntentStatusCanceled, pi.Status, "PaymentIntent %s of order %s is an orphan", pi.ID, orderID)
	}
	switch wantStatus {
	case string(orders.Paid):
		require.NotNil(h.t, mine, "the paid order's PaymentIntent exists at Stripe")
		require.Equal(h.t, stripe.PaymentIntentStatusSucceeded, mine.Status)
		require.Equal(h.t, 1, moving)
	case string(orders.PaymentFailed), string(orders.Canceled):
		require.Zero(h.t, moving, "a failed order moved no money")
	}
	for _, r := range h.emu.Requests() {
		if slices.Contains(expected400, r.Op) {
			continue
		}
		require.NotEqual(h.t, http.StatusBadRequest, r.Status,
			"Stripe refused %s %s (key %s): an idempotency_error or a resent key", r.Method, r.Path, r.IdempotencyKey)
	}
	return pis
}

// untilFinal sends the checkout again with the same key, as a client that
// follows Retry-After would, until its answer is final (not 409, 502 or
// 503), and returns every answer.
func (h *harness) untilFinal(key, body string) []reply {
	h.t.Helper()
	var rs []reply
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := h.checkout(key, body)
		rs = append(rs, r)
		if r.status != http.StatusConflict && r.status != http.StatusBadGateway && r.status != http.StatusServiceUnavailable {
			return rs
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("no final answer for %s after %d tries; last %d %s", key, len(rs), r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
