// Package sweep holds the loops that sweep the tables, outside the request
// path, for what the request path left behind (DESIGN.md, "After the
// commit"): the Completer finishes idempotency keys whose owner died (every
// keyed route, through idempotency.Resumer), the Reconciler settles orders still waiting
// on Stripe, and the Reaper deletes rows past their retention. cmd/worker
// runs them; any number of workers may run them at once.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/tracing"
)

// KeyCompleter pushes one unfinished idempotency key forward through its
// route's state machine. *idempotency.Resumer (what api.Completer builds for
// every keyed route) and *checkout.Service (its own routes) satisfy it.
//
// Complete must be safe to call for any key, from any number of processes at
// once: it takes the key over only if its lease has expired and nobody else
// holds the row (idempotency.Store.TakeOver), and every write it makes is
// fenced by the lease, so a key is completed at most once. It reports false
// when there was nothing to do (the key finished meanwhile, its lease is
// live, another completer holds it, or it belongs to a route it does not
// handle). An error means the key is still unfinished and may be tried again.
type KeyCompleter interface {
	Complete(ctx context.Context, keyID int64) (bool, error)
}

// Results counted by checkout_completer_keys_total.
const (
	ResultCompleted = "completed" // Complete finished the key
	ResultSkipped   = "skipped"   // Complete had nothing to do
	ResultFailed    = "failed"    // Complete returned an error; tried again in a later round
)

// CompleterConfig configures a Completer. Zero fields take the defaults
// named in their comments.
type CompleterConfig struct {
	// Interval is the pause between two rounds (env COMPLETER_INTERVAL,
	// default 5s).
	Interval time.Duration
	// Grace is how long after a key's lease expired the completer leaves it
	// to the client's own retry, which usually comes first and gets its
	// answer directly (default: one lease, the Store's Lease, i.e.
	// IDEMPOTENCY_LEASE; 30s if that is zero too).
	Grace time.Duration
	// BatchSize caps the keys one round works on (default 100).
	BatchSize int
	// Concurrency is how many keys one round completes at once (default
	// 4), so that one slow key (Stripe timing out) does not hold up the
	// others.
	Concurrency int
	// KeyTimeout bounds the completion of one key (default 30s). It runs
	// on a context detached from Run's, so a shutdown lets the keys in
	// flight finish (within KeyTimeout) instead of cutting a charge short.
	KeyTimeout time.Duration
	// MaxBackoff caps how long a key that keeps failing is left out of the
	// rounds (default 5m). Its wait doubles from Interval with each failure,
	// so that a few broken keys neither fill every batch nor the log.
	MaxBackoff time.Duration
	// Logger receives one line per completed or failed key (default: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Now is the clock (default: the Store's clock, else time.Now). Lease
	// comparisons must use the same clock as the Store.
	Now func() time.Time
}

// Completer finishes checkouts whose lease expired before they finished
// (their process died or gave up on a transient failure and no client
// retried): each round it lists keys whose lease ended more than Grace ago
// and hands each to a KeyCompleter. Create it with NewCompleter.
type Completer struct {
	db     *gorm.DB
	keys   *idempotency.Store
	svc    KeyCompleter
	cfg    CompleterConfig
	logger *slog.Logger

	keysTotal  *prometheus.CounterVec
	unfinished prometheus.Gauge

	mu sync.Mutex
	// failing holds the keys that failed, with when to try them again. It is
	// per process: another worker may still try such a key, which is safe.
	failing map[int64]backoff
}

type backoff struct {
	failures int
	until    time.Time
}

// NewCompleter returns a Completer that lists keys with keys.Expired on db
// and completes them with svc. It registers, on cfg.Registerer:
//
//	checkout_completer_keys_total{result}     keys handed to svc, by result (completed, skipped, failed)
//	checkout_idempotency_unfinished_keys      unfinished keys whose lease expired more than Grace ago, after the last round
//
// It returns an error if the metrics cannot be registered (e.g. twice on one
// Registerer).
func NewCompleter(db *gorm.DB, keys *idempotency.Store, svc KeyCompleter, cfg CompleterConfig) (*Completer, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = keys.Lease
		if cfg.Grace <= 0 {
			cfg.Grace = 30 * time.Second
		}
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 100
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.KeyTimeout <= 0 {
		cfg.KeyTimeout = 30 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = keys.Now
		if cfg.Now == nil {
			cfg.Now = time.Now
		}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Completer{
		db: db, keys: keys, svc: svc, cfg: cfg, logger: logger,
		failing: map[int64]backoff{},
		keysTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_completer_keys_total",
			Help: "Expired unfinished idempotency keys the completer handled, by result (completed, skipped, failed).",
		}, []string{"result"}),
		unfinished: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "checkout_idempotency_unfinished_keys",
			Help: "Unfinished idempotency keys whose lease expired more than the completer's grace period ago, after its last round.",
		}),
	}
	for _, r := range []string{ResultCompleted, ResultSkipped, ResultFailed} {
		c.keysTotal.WithLabelValues(r) // export zeros so that rate() works from the start
	}
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{c.keysTotal, c.unfinished} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("completer: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// Run runs a round at once and then every Interval until ctx ends, and
// returns nil after the round in flight has finished (each key within
// KeyTimeout). Errors are logged and retried in the next round; they never
// end Run.
func (c *Completer) Run(ctx context.Context) error {
	return Every(ctx, c.cfg.Interval, c.logger, "completer", func(ctx context.Context) error {
		_, err := c.RunOnce(ctx)
		return err
	})
}

// Round counts what one round did with the keys it handed to the
// KeyCompleter.
type Round struct {
	Completed, Skipped, Failed int
}

// RunOnce runs one round: it lists up to BatchSize due keys, completes them
// (Concurrency at a time) and refreshes the unfinished-keys gauge. A key's
// failure is counted in Round.Failed and logged, not returned; the error is
// for the round itself (listing or counting the keys failed). When ctx ends
// no new key is started, and RunOnce returns after the keys in flight.
func (c *Completer) RunOnce(ctx context.Context) (Round, error) {
	var round Round
	now := c.cfg.Now()
	cutoff := now.Add(-c.cfg.Grace)

	// Ask for more than a batch so that keys in backoff, which stay at the
	// head of the list (their takeover rolled back), do not crowd out the
	// others.
	c.mu.Lock()
	limit := c.cfg.BatchSize + len(c.failing)
	c.mu.Unlock()
	ids, err := c.keys.Expired(ctx, c.db, cutoff, limit)
	if err != nil {
		return round, err
	}
	due := c.due(ids, now)

	var mu sync.Mutex
	g := new(errgroup.Group)
	g.SetLimit(c.cfg.Concurrency)
	for _, id := range due {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			result := c.complete(ctx, id)
			mu.Lock()
			defer mu.Unlock()
			switch result {
			case ResultCompleted:
				round.Completed++
			case ResultSkipped:
				round.Skipped++
			default:
				round.Failed++
			}
			return nil
		})
	}
	g.Wait() // the goroutines report through round, never an error

	// Counted after the round, so that the gauge shows what the completer
	// could not finish rather than what it is about to.
	n, err := c.keys.CountExpired(ctx, c.db, cutoff)
	if err != nil {
		return round, err
	}
	c.unfinished.Set(float64(n))
	return round, nil
}

// due returns the first BatchSize of ids that are not backing off, and
// forgets the backoff of keys that are no longer listed (finished by a
// client or another worker).
func (c *Completer) due(ids []int64, now time.Time) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	listed := make(map[int64]bool, len(ids))
	due := make([]int64, 0, min(len(ids), c.cfg.BatchSize))
	for _, id := range ids {
		listed[id] = true
		if b, ok := c.failing[id]; ok && now.Before(b.until) {
			continue
		}
		if len(due) < c.cfg.BatchSize {
			due = append(due, id)
		}
	}
	for id := range c.failing {
		if !listed[id] {
			delete(c.failing, id)
		}
	}
	return due
}

// complete hands key id to the KeyCompleter and records the result.
func (c *Completer) complete(ctx context.Context, id int64) string {
	// Detached: a shutdown must not cut a charge short between Stripe and
	// transaction 2. The state machine could resume it, but finishing is
	// cheaper and leaves no 502 for the log.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.KeyTimeout)
	defer cancel()
	// A trace of its own (its cause is a lease that expired), which the
	// resumed command links to the order's checkout trace.
	kctx, span := tracing.Start(kctx, "completer complete", trace.WithNewRoot(),
		trace.WithAttributes(attribute.Int64("checkout.idempotency_key_id", id)))
	done, err := c.svc.Complete(kctx, id)
	tracing.End(span, err)

	result := ResultSkipped
	switch {
	case err != nil:
		result = ResultFailed
	case done:
		result = ResultCompleted
	}
	c.keysTotal.WithLabelValues(result).Inc()

	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		delete(c.failing, id)
		if done {
			c.logger.Info("completed expired idempotency key", "key_id", id)
		}
		return result
	}
	b := c.failing[id]
	b.failures++
	wait := c.cfg.Interval << min(b.failures, 20)
	if wait <= 0 || wait > c.cfg.MaxBackoff {
		wait = c.cfg.MaxBackoff
	}
	b.until = c.cfg.Now().Add(wait)
	// Bounded, so that a flood of broken keys cannot grow the map (or the
	// listing limit) without end; untracked keys are simply tried each round.
	if _, tracked := c.failing[id]; tracked || len(c.failing) < 10*c.cfg.BatchSize {
		c.failing[id] = b
	}
	level := slog.LevelWarn
	if errors.Is(err, context.DeadlineExceeded) {
		level = slog.LevelError // KeyTimeout: something is hanging
	}
	c.logger.Log(ctx, level, "complete expired idempotency key", "key_id", id, "failures", b.failures, "retry_in", wait, "err", err)
	return result
}
