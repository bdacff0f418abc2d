package sweep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/api"
	"github.com/onceonly/checkout/internal/auth"
	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/sweep"
	"github.com/onceonly/checkout/internal/telemetry"
	"github.com/onceonly/checkout/internal/testenv"
)

// The checkout service must satisfy the interface the completer declares.
var (
	_ sweep.KeyCompleter = (*checkout.Service)(nil)
	_ sweep.KeyCompleter = (*idempotency.Resumer)(nil)
)

const (
	teeBody      = `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}`
	declinedBody = `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_chargeDeclined"}`
)

// completerEnv is one test's API (to create checkouts the way clients do)
// and the pieces a worker's completer is built from, over one database and
// one Stripe emulator.
type completerEnv struct {
	t      testing.TB
	db     *gorm.DB
	emu    *stripeemu.Emulator
	emuURL string
	srv    *httptest.Server
	logs   *testenv.Output
	logger *slog.Logger
}

func setupCompleter(t testing.TB) *completerEnv {
	t.Helper()
	e := &completerEnv{t: t, logs: &testenv.Output{}}
	e.db, _ = pgtest.NewDB(t)
	rdb, prefix := testenv.Redis(t)

	e.emu = stripeemu.New()
	emuSrv := httptest.NewServer(e.emu)
	t.Cleanup(emuSrv.Close)
	t.Cleanup(e.emu.Close)
	e.emuURL = emuSrv.URL

	e.logger = telemetry.NewLogger(e.logs, slog.LevelDebug)
	keys, err := auth.ParseKeys(auth.DefaultKeys)
	require.NoError(t, err)
	a := api.New(api.Config{
		RedisKeyPrefix: prefix,
		TTL:            24 * time.Hour,
		Lease:          5 * time.Second,
		FailureMode:    idempotency.FailClosed,
		WorkTimeout:    30 * time.Second,
	}, api.Deps{DB: e.db, Redis: rdb, Payments: e.payments(nil), Keys: keys,
		Logger: e.logger.With("process", "api"), Registry: telemetry.NewRegistry()})
	e.srv = httptest.NewServer(a.Handler)
	t.Cleanup(e.srv.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service logs:\n%s", e.logs.String())
		}
	})
	return e
}

// payments returns a Stripe client of the emulator that gives up quickly,
// so that a failing Stripe turns into a 502 (or a failed completion) fast.
func (e *completerEnv) payments(reg prometheus.Registerer) *payments.Client {
	return payments.NewClient(payments.Config{APIBase: e.emuURL, SecretKey: "sk_test_123",
		Timeout: 2 * time.Second, MaxElapsed: 50 * time.Millisecond}, e.logger, reg)
}

// worker is what cmd/worker wires: its own key store and checkout service
// (same database, same Stripe) and a completer over them.
type worker struct {
	completer *sweep.Completer
	svc       *checkout.Service
	reg       *prometheus.Registry
}

// takeovers returns the registry the worker's key store counts takeovers on.
func (e *completerEnv) takeovers(w *worker) *prometheus.Registry { return w.reg }

func (e *completerEnv) worker(cfg sweep.CompleterConfig, now func() time.Time) *worker {
	e.t.Helper()
	if now == nil {
		now = time.Now
	}
	reg := prometheus.NewRegistry()
	store := &idempotency.Store{Lease: 5 * time.Second, TTL: 24 * time.Hour, Now: now, Metrics: idempotency.NewMetrics(reg)}
	svc := &checkout.Service{DB: e.db, Keys: store, Payments: e.payments(reg),
		Logger: e.logger.With("process", "worker"), Now: now}
	cfg.Logger, cfg.Registerer = e.logger.With("process", "worker"), reg
	c, err := sweep.NewCompleter(e.db, store, svc, cfg)
	require.NoError(e.t, err)
	return &worker{completer: c, svc: svc, reg: reg}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// checkout posts body to /v1/checkouts as tenant acme with key.
func (e *completerEnv) checkout(key, body string) reply {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/checkouts", bytes.NewBufferString(body))
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// stuck leaves each key as a process that died after transaction 1 would:
// the order created, Stripe never reached (it answered 502 to every
// attempt, 503), the lease held by a dead owner and expired a minute ago.
func (e *completerEnv) stuck(body string, keys ...string) {
	e.t.Helper()
	require.NoError(e.t, e.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: http.StatusServiceUnavailable}))
	for _, k := range keys {
		r := e.checkout(k, body)
		require.Equal(e.t, http.StatusBadGateway, r.status, "%s", r.body)
	}
	e.emu.ClearFaults()
	e.expireLease(time.Minute, keys...)
	require.Equal(e.t, 0, e.emu.TotalCreated())
}

// expireLease gives keys to a dead owner whose lease ended ago.
func (e *completerEnv) expireLease(ago time.Duration, keys ...string) {
	e.t.Helper()
	res := e.db.Exec(`UPDATE idempotency_keys SET lease_owner = 'dead', lease_expires_at = ? WHERE key IN ?`,
		time.Now().Add(-ago), keys)
	require.NoError(e.t, res.Error)
	require.EqualValues(e.t, len(keys), res.RowsAffected)
}

// keyState is a key's row and its order's.
type keyState struct {
	RecoveryPoint  string
	ResponseStatus *int
	OrderID        string
	OrderStatus    string
}

func (e *completerEnv) state(key string) keyState {
	e.t.Helper()
	var s keyState
	require.NoError(e.t, e.db.Raw(`
		SELECT k.recovery_point, k.response_status, k.order_id, o.status AS order_status
		FROM idempotency_keys k JOIN orders o ON o.id = k.order_id
		WHERE k.tenant_id = 'acme' AND k.key = ?`, key).Scan(&s).Error)
	require.NotEmpty(e.t, s.OrderID, "key %s has no order", key)
	return s
}

// charges returns how many PaymentIntents the key's order has at Stripe
// (the emulator's own state), whatever their status.
func (e *completerEnv) charges(_ string, s keyState) int {
	n := 0
	for _, pi := range e.emu.PaymentIntents() {
		if pi.Metadata["order_id"] == s.OrderID {
			n++
		}
	}
	return n
}

func (e *completerEnv) stock(sku string) int64 {
	e.t.Helper()
	var n int64
	require.NoError(e.t, e.db.Raw(`SELECT stock FROM products WHERE sku = ?`, sku).Scan(&n).Error)
	return n
}

// TestCompleterFinishesStuckCheckout: a checkout whose process died after
// creating the order is charged once with its own Stripe key, paid, its
// order.paid event written, and a later client retry replays the outcome.
func TestCompleterFinishesStuckCheckout(t *testing.T) {
	t.Parallel()
	e := setupCompleter(t)
	e.stuck(teeBody, "stuck-1")
	require.Equal(t, checkout.RecoveryPointOrderCreated, e.state("stuck-1").RecoveryPoint)

	w := e.worker(sweep.CompleterConfig{}, nil)
	round, err := w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Completed: 1}, round)

	s := e.state("stuck-1")
	require.Equal(t, idempotency.RecoveryPointFinished, s.RecoveryPoint)
	require.Equal(t, string(orders.Paid), s.OrderStatus)
	require.Equal(t, 1, e.charges("stuck-1", s))
	require.Equal(t, 1, e.emu.TotalCreated())
	require.Equal(t, 1, count(t, e.db, `SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, s.OrderID))

	retry := e.checkout("stuck-1", teeBody)
	require.Equal(t, http.StatusCreated, retry.status, "%s", retry.body)
	require.Equal(t, "true", retry.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, "/v1/orders/"+s.OrderID, retry.header.Get("Location"))
	var o orders.Order
	require.NoError(t, json.Unmarshal(retry.body, &o))
	require.Equal(t, s.OrderID, o.ID)
	require.Equal(t, orders.Paid, o.Status)

	// Nothing is left to do: another round changes nothing.
	round, err = w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{}, round)
	require.Equal(t, 1, e.emu.TotalCreated())

	require.EqualValues(t, 1, metric(t, w.reg, "checkout_completer_keys_total", "result", "completed"))
	require.EqualValues(t, 0, metric(t, w.reg, "checkout_completer_keys_total", "result", "skipped"))
	require.EqualValues(t, 0, metric(t, w.reg, "checkout_completer_keys_total", "result", "failed"))
	require.EqualValues(t, 0, metric(t, w.reg, "checkout_idempotency_unfinished_keys"))
}

// TestCompleterDeclinedCard: a stuck checkout with a card that is declined
// ends payment_failed with its stock back, and the 402 is replayed.
func TestCompleterDeclinedCard(t *testing.T) {
	t.Parallel()
	e := setupCompleter(t)
	before := e.stock("sku_tee")
	e.stuck(declinedBody, "declined-1")
	require.Equal(t, before-2, e.stock("sku_tee"), "reserved by transaction 1")

	w := e.worker(sweep.CompleterConfig{}, nil)
	round, err := w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Completed: 1}, round)

	s := e.state("declined-1")
	require.Equal(t, idempotency.RecoveryPointFinished, s.RecoveryPoint)
	require.Equal(t, string(orders.PaymentFailed), s.OrderStatus)
	require.NotNil(t, s.ResponseStatus)
	require.Equal(t, http.StatusPaymentRequired, *s.ResponseStatus)
	require.Equal(t, before, e.stock("sku_tee"), "a declined payment gives its stock back")
	require.Equal(t, 1, e.charges("declined-1", s))
	require.Equal(t, 1, count(t, e.db, `SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, s.OrderID))
	require.Equal(t, 0, count(t, e.db, `SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, s.OrderID))

	retry := e.checkout("declined-1", declinedBody)
	require.Equal(t, http.StatusPaymentRequired, retry.status, "%s", retry.body)
	require.Equal(t, "true", retry.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, 1, e.emu.TotalCreated())
}

// TestCompleterLeavesLiveLeases: a key whose lease is live, or expired
// within the grace period (its client is probably retrying), is not
// touched; only the one past the grace period is completed.
func TestCompleterLeavesLiveLeases(t *testing.T) {
	t.Parallel()
	e := setupCompleter(t)
	e.stuck(teeBody, "live-1", "grace-1", "dead-1")
	require.NoError(t, e.db.Exec(`UPDATE idempotency_keys SET lease_owner = 'alive', lease_expires_at = ? WHERE key = 'live-1'`,
		time.Now().Add(time.Hour)).Error)
	e.expireLease(time.Second, "grace-1")

	w := e.worker(sweep.CompleterConfig{Grace: 30 * time.Second}, nil)
	round, err := w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Completed: 1}, round)

	require.Equal(t, idempotency.RecoveryPointFinished, e.state("dead-1").RecoveryPoint)
	for _, k := range []string{"live-1", "grace-1"} {
		s := e.state(k)
		require.Equal(t, checkout.RecoveryPointOrderCreated, s.RecoveryPoint, k)
		require.Equal(t, string(orders.PendingPayment), s.OrderStatus, k)
		require.Equal(t, 0, e.charges(k, s), k)
	}
	require.Equal(t, 1, count(t, e.db, `SELECT count(*) FROM idempotency_keys WHERE key = 'live-1' AND lease_owner = 'alive'`))
	require.EqualValues(t, 0, metric(t, w.reg, "checkout_idempotency_unfinished_keys"))

	// Once the grace period has passed, the other expired key is due.
	e.expireLease(time.Minute, "grace-1")
	round, err = w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Completed: 1}, round)
	require.Equal(t, idempotency.RecoveryPointFinished, e.state("grace-1").RecoveryPoint)
	require.Equal(t, checkout.RecoveryPointOrderCreated, e.state("live-1").RecoveryPoint)
	require.Equal(t, 2, e.emu.TotalCreated())
}

// TestCompleterRetriesAfterFailure: while Stripe is down the completion
// fails (counted, logged, the key keeps its recovery point); a later round
// completes it with the same Stripe key, charging once.
func TestCompleterRetriesAfterFailure(t *testing.T) {
	t.Parallel()
	e := setupCompleter(t)
	e.stuck(teeBody, "flaky-1")
	clk := &testenv.Clock{}
	w := e.worker(sweep.CompleterConfig{Interval: time.Second, Grace: 30 * time.Second}, clk.Now)

	require.NoError(t, e.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: http.StatusServiceUnavailable}))
	round, err := w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Failed: 1}, round)
	require.Equal(t, checkout.RecoveryPointOrderCreated, e.state("flaky-1").RecoveryPoint)
	require.Contains(t, e.logs.String(), "complete expired idempotency key")
	require.EqualValues(t, 1, metric(t, w.reg, "checkout_completer_keys_total", "result", "failed"))
	require.EqualValues(t, 0, metric(t, w.reg, "checkout_completer_keys_total", "result", "completed"))

	// The failed attempt released its lease (now): the key waits out the
	// grace period and its backoff again.
	e.emu.ClearFaults()
	round, err = w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{}, round)

	clk.Advance(time.Minute)
	round, err = w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Completed: 1}, round)
	s := e.state("flaky-1")
	require.Equal(t, string(orders.Paid), s.OrderStatus)
	require.Equal(t, 1, e.charges("flaky-1", s))
	require.Equal(t, 1, e.emu.TotalCreated())
	require.EqualValues(t, 1, metric(t, w.reg, "checkout_completer_keys_total", "result", "failed"))
	require.EqualValues(t, 1, metric(t, w.reg, "checkout_completer_keys_total", "result", "completed"))
}

// TestTwoCompletersConcurrently: two workers' completers running at once
// over 20 stuck checkouts complete each once: one PaymentIntent per key,
// one order.paid per order.
func TestTwoCompletersConcurrently(t *testing.T) {
	t.Parallel()
	e := setupCompleter(t)
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = "many-" + string(rune('a'+i))
	}
	e.stuck(teeBody, keys...)

	cfg := sweep.CompleterConfig{Interval: 10 * time.Millisecond, Concurrency: 4}
	workers := []*worker{e.worker(cfg, nil), e.worker(cfg, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	var g errgroup.Group
	for _, w := range workers {
		g.Go(func() error { return w.completer.Run(ctx) })
	}
	eventually(t, "every stuck key to be finished", func() bool {
		return count(t, e.db, `SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished'`) == len(keys)
	})
	cancel()
	require.NoError(t, g.Wait())

	for _, k := range keys {
		s := e.state(k)
		require.Equal(t, string(orders.Paid), s.OrderStatus, k)
		require.Equal(t, 1, e.charges(k, s), k)
	}
	require.Equal(t, len(keys), e.emu.TotalCreated())
	require.Equal(t, len(keys), count(t, e.db, `SELECT count(*) FROM orders WHERE status = 'paid'`))
	require.Equal(t, len(keys), count(t, e.db, `SELECT count(DISTINCT aggregate_id) FROM outbox WHERE type = 'order.paid'`))
	require.Equal(t, len(keys), count(t, e.db, `SELECT count(*) FROM outbox WHERE type = 'order.paid'`))

	var completed, failed float64
	for _, w := range workers {
		completed += metric(t, w.reg, "checkout_completer_keys_total", "result", "completed")
		failed += metric(t, w.reg, "checkout_completer_keys_total", "result", "failed")
	}
	require.EqualValues(t, len(keys), completed, "each key completed by exactly one worker")
	require.EqualValues(t, 0, failed)
}

// TestCompleterLeavesOtherRoutes: a key of a route the checkout service
// does not run (here a made-up one) is not taken over, even for a moment:
// its row, lease owner included, is left exactly as it was.
func TestCompleterLeavesOtherRoutes(t *testing.T) {
	t.Parallel()
	e := setupCompleter(t)
	expired := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	var id int64
	require.NoError(t, e.db.Raw(`
		INSERT INTO idempotency_keys (tenant_id, route, key, fingerprint, recovery_point,
		  lease_owner, lease_expires_at, created_at, updated_at, expires_at)
		VALUES ('acme', 'POST /v1/somewhere/else', 'other-1', 'fp', 'started', 'dead', ?, ?, ?, ?)
		RETURNING id`, expired, expired, expired, time.Now().Add(time.Hour)).Scan(&id).Error)

	w := e.worker(sweep.CompleterConfig{}, nil)
	round, err := w.completer.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Skipped: 1}, round)

	var row struct {
		LeaseOwner     string
		LeaseExpiresAt time.Time
		UpdatedAt      time.Time
	}
	require.NoError(t, e.db.Raw(`SELECT lease_owner, lease_expires_at, updated_at FROM idempotency_keys WHERE id = ?`, id).Scan(&row).Error)
	require.Equal(t, "dead", row.LeaseOwner, "not taken over")
	require.True(t, expired.Equal(row.LeaseExpiresAt), "lease untouched: %s", row.LeaseExpiresAt)
	require.True(t, expired.Equal(row.UpdatedAt), "row untouched: %s", row.UpdatedAt)
	require.EqualValues(t, 0, metric(t, e.takeovers(w), "checkout_idempotency_takeovers_total"))
}

// fakeCompleter answers Complete from a table, finishing the keys it
// reports completed.
type fakeCompleter struct {
	db     *gorm.DB
	mu     sync.Mutex
	answer map[int64]string // a sweep.Result*
	calls  []int64
}

func (f *fakeCompleter) Complete(ctx context.Context, id int64) (bool, error) {
	f.mu.Lock()
	f.calls = append(f.calls, id)
	answer := f.answer[id]
	f.mu.Unlock()
	switch answer {
	case sweep.ResultCompleted:
		return true, f.db.WithContext(ctx).Exec(`UPDATE idempotency_keys SET recovery_point = 'finished' WHERE id = ?`, id).Error
	case sweep.ResultSkipped:
		return false, nil
	}
	return false, errors.New("resume: order is not pending")
}

// TestCompleterFailingKeyDoesNotBlockOthers: with a batch of one, a key that
// keeps failing (the oldest, so always listed first) backs off and the keys
// behind it are still worked on; every result moves its counter by one.
func TestCompleterFailingKeyDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now()
	insert := func(key string, leaseExpired time.Duration) int64 {
		var id int64
		require.NoError(t, db.Raw(`
			INSERT INTO idempotency_keys (tenant_id, route, key, fingerprint, recovery_point,
			  lease_owner, lease_expires_at, created_at, updated_at, expires_at)
			VALUES ('acme', 'POST /v1/checkouts', ?, 'fp', 'order_created', 'dead', ?, ?, ?, ?)
			RETURNING id`, key, now.Add(-leaseExpired), now, now, now.Add(time.Hour)).Scan(&id).Error)
		return id
	}
	poison, good, skip := insert("poison", 3*time.Hour), insert("good", 2*time.Hour), insert("skip", time.Hour)
	fake := &fakeCompleter{db: db, answer: map[int64]string{
		poison: sweep.ResultFailed, good: sweep.ResultCompleted, skip: sweep.ResultSkipped}}

	clk := &testenv.Clock{}
	reg := prometheus.NewRegistry()
	c, err := sweep.NewCompleter(db, &idempotency.Store{Lease: 5 * time.Second, TTL: time.Hour, Now: clk.Now}, fake,
		sweep.CompleterConfig{BatchSize: 1, Interval: time.Second, Registerer: reg, Now: clk.Now})
	require.NoError(t, err)
	counters := func() [3]float64 {
		return [3]float64{
			metric(t, reg, "checkout_completer_keys_total", "result", sweep.ResultCompleted),
			metric(t, reg, "checkout_completer_keys_total", "result", sweep.ResultSkipped),
			metric(t, reg, "checkout_completer_keys_total", "result", sweep.ResultFailed),
		}
	}

	for i, tc := range []struct {
		advance time.Duration
		round   sweep.Round
		called  int64
		metrics [3]float64 // completed, skipped, failed
		gauge   float64
	}{
		{0, sweep.Round{Failed: 1}, poison, [3]float64{0, 0, 1}, 3},
		{0, sweep.Round{Completed: 1}, good, [3]float64{1, 0, 1}, 2}, // poison is backing off
		{0, sweep.Round{Skipped: 1}, skip, [3]float64{1, 1, 1}, 2},
		{time.Hour, sweep.Round{Failed: 1}, poison, [3]float64{1, 1, 2}, 2}, // its backoff is over
	} {
		clk.Advance(tc.advance)
		round, err := c.RunOnce(context.Background())
		require.NoError(t, err, "round %d", i)
		require.Equal(t, tc.round, round, "round %d", i)
		require.Equal(t, tc.called, fake.calls[len(fake.calls)-1], "round %d", i)
		require.Equal(t, tc.metrics, counters(), "round %d", i)
		require.EqualValues(t, tc.gauge, metric(t, reg, "checkout_idempotency_unfinished_keys"), "round %d", i)
	}
	require.Len(t, fake.calls, 4)
}

// TestNewCompleterRegistersOnce: a second completer on the same registry is
// an error, not a panic.
func TestNewCompleterRegistersOnce(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store := &idempotency.Store{Now: time.Now}
	_, err := sweep.NewCompleter(nil, store, &fakeCompleter{}, sweep.CompleterConfig{Registerer: reg})
	require.NoError(t, err)
	_, err = sweep.NewCompleter(nil, store, &fakeCompleter{}, sweep.CompleterConfig{Registerer: reg})
	require.Error(t, err)
}

// TestCompleterKeepsLeaseWhileSlow: a completion slower than the lease (Stripe
// holds the create) extends the key's lease while it works, as the API's
// gateway does, so a second worker's completer finds the lease live and
// leaves the key alone: one create attempt, one PaymentIntent, one
// completion.
func TestCompleterKeepsLeaseWhileSlow(t *testing.T) {
	t.Parallel()
	e := setupCompleter(t)
	e.stuck(teeBody, "slow-1")
	require.NoError(t, e.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, Before: 1500 * time.Millisecond}))

	lease := 300 * time.Millisecond
	mk := func() (*sweep.Completer, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		store := &idempotency.Store{Lease: lease, TTL: 24 * time.Hour, Now: time.Now, Metrics: idempotency.NewMetrics(reg)}
		svc := &checkout.Service{DB: e.db, Keys: store, Payments: payments.NewClient(payments.Config{APIBase: e.emuURL,
			SecretKey: "sk_test_123", Timeout: 5 * time.Second, MaxElapsed: 5 * time.Second}, e.logger, reg),
			Logger: e.logger, Now: time.Now}
		c, err := sweep.NewCompleter(e.db, store, svc, sweep.CompleterConfig{Grace: time.Millisecond, Registerer: reg})
		require.NoError(t, err)
		return c, reg
	}
	first, firstReg := mk()
	second, _ := mk()

	done := make(chan sweep.Round, 1)
	go func() {
		r, err := first.RunOnce(context.Background())
		assert.NoError(t, err)
		done <- r
	}()
	eventually(t, "Stripe to hold the create", func() bool { return e.emu.InFlight() == 1 })
	taken := time.Now() // after the takeover, which leased the key until taken + lease at most
	eventually(t, "the lease to be extended past two terms", func() bool {
		var expires time.Time
		require.NoError(t, e.db.Raw(`SELECT lease_expires_at FROM idempotency_keys WHERE key = 'slow-1'`).Scan(&expires).Error)
		return expires.After(taken.Add(2 * lease))
	})
	round, err := second.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{}, round, "the lease is live: nothing to take over")

	require.Equal(t, sweep.Round{Completed: 1}, <-done)
	require.GreaterOrEqual(t, metric(t, firstReg, "checkout_idempotency_lease_extensions_total", "store", "postgres"), 2.0)
	s := e.state("slow-1")
	require.Equal(t, string(orders.Paid), s.OrderStatus)
	require.Equal(t, 1, e.charges("slow-1", s))
	require.Equal(t, 1, count(t, e.db, `SELECT count(*) FROM payment_attempts WHERE order_id = ? AND step = 'create'`, s.OrderID))
}
