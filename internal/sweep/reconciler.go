package sweep

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/orders"
)

// OrderReconciler settles orders whose payment waits for Stripe or for the
// customer. *checkout.Service satisfies it; both methods run the same saga
// as the API request and are safe from any number of processes at once.
type OrderReconciler interface {
	// ReconcileOrder applies Stripe's state of a requires_action order's
	// PaymentIntent (and cancels it after PAYMENT_ACTION_TIMEOUT). It
	// reports whether the order changed.
	ReconcileOrder(ctx context.Context, tenantID, orderID string) (bool, error)
	// Complete resumes the unfinished key keyID (a checkout whose payment
	// is unknown or indeterminate) if its lease has expired.
	Complete(ctx context.Context, keyID int64) (bool, error)
	// SweepOrphans cancels the PaymentIntents of an order other than its
	// own (left by an indeterminate create) and returns how many.
	SweepOrphans(ctx context.Context, tenantID, orderID string) (int, error)
}

// ReconcilerConfig configures a Reconciler. Zero fields take the defaults
// named in their comments.
type ReconcilerConfig struct {
	// Interval is the pause between two rounds (env RECONCILER_INTERVAL,
	// default 10s). Each round asks Stripe about every order waiting in
	// requires_action, so it bounds how late an authenticated payment is
	// noticed without a webhook.
	Interval time.Duration
	// BatchSize caps the orders of each kind one round works on (default 100).
	BatchSize int
	// Concurrency is how many orders one round reconciles at once (default 4).
	Concurrency int
	// OrderTimeout bounds one order's reconciliation (default 30s), on a
	// context detached from Run's.
	OrderTimeout time.Duration
	// SweepEvery and SweepFor: an order whose create was indeterminate or
	// unanswered, and tried again under a new key, is searched for orphan
	// PaymentIntents every SweepEvery for SweepFor after that new attempt
	// (env ORPHAN_SWEEP_INTERVAL, default 1h; 72h).
	SweepEvery, SweepFor time.Duration
	// Grace is how long after a key's lease expired the reconciler leaves
	// an order with an unknown payment to the client's own retry (default
	// 30s; cmd/worker passes IDEMPOTENCY_LEASE, as for the completer).
	Grace time.Duration
	// Logger receives a line per changed or failed order (default: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now); lease comparisons use it.
	Now func() time.Time
}

// Reconciler settles, each round: orders in requires_action (their
// PaymentIntent polled at Stripe, canceled after PAYMENT_ACTION_TIMEOUT),
// and orders in payment_unknown, or pending_payment whose last payment
// attempt was indeterminate (a stored 500), whose key's lease expired more
// than Grace ago (resumed through Complete, the saga the API runs). Keys
// whose process died mid-step are the completer's. Create it with
// NewReconciler.
type Reconciler struct {
	db     *gorm.DB
	svc    OrderReconciler
	cfg    ReconcilerConfig
	logger *slog.Logger

	// actionsAfter is where the next round's page of orders in
	// requires_action starts (actionsPage).
	actionsMu    sync.Mutex
	actionsAfter orders.Position

	ordersTotal    *prometheus.CounterVec
	orphans        prometheus.Counter
	unknown        prometheus.Gauge
	requiresAction prometheus.Gauge
}

// Results counted by checkout_reconciler_orders_total (with ResultFailed).
const (
	ResultChanged   = "changed"   // the order's status changed
	ResultUnchanged = "unchanged" // Stripe's state settled nothing yet
)

// NewReconciler returns a Reconciler over db and svc. It registers, on
// cfg.Registerer:
//
//	checkout_reconciler_orders_total{result}  orders handled, by result (changed, unchanged, failed)
//	checkout_reconciler_orphans_canceled_total PaymentIntents of indeterminate creates canceled by the sweep
//	checkout_orders_payment_unknown           orders in payment_unknown after the last round
//	checkout_orders_requires_action           orders waiting for the customer after the last round
func NewReconciler(db *gorm.DB, svc OrderReconciler, cfg ReconcilerConfig) (*Reconciler, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 100
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.OrderTimeout <= 0 {
		cfg.OrderTimeout = 30 * time.Second
	}
	if cfg.Grace <= 0 {
		cfg.Grace = 30 * time.Second
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = time.Hour
	}
	if cfg.SweepFor <= 0 {
		cfg.SweepFor = 72 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{
		db: db, svc: svc, cfg: cfg, logger: logger,
		ordersTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_reconciler_orders_total",
			Help: "Orders the reconciler handled, by result (changed, unchanged, failed).",
		}, []string{"result"}),
		orphans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_reconciler_orphans_canceled_total",
			Help: "PaymentIntents left by indeterminate creates (not the order's, never confirmed) that the reconciler's sweep canceled.",
		}),
		unknown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "checkout_orders_payment_unknown",
			Help: "Orders in payment_unknown (PAYMENT_UNKNOWN_AFTER of failed reconciliation) after the reconciler's last round.",
		}),
		requiresAction: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "checkout_orders_requires_action",
			Help: "Orders waiting for the customer's authentication (requires_action) after the reconciler's last round.",
		}),
	}
	for _, res := range []string{ResultChanged, ResultUnchanged, ResultFailed} {
		r.ordersTotal.WithLabelValues(res)
	}
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{r.ordersTotal, r.orphans, r.unknown, r.requiresAction} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("reconciler: register metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run runs a round at once and then every Interval until ctx ends, and
// returns nil after the round in flight. Errors are logged, never returned.
func (r *Reconciler) Run(ctx context.Context) error {
	return every(ctx, r.cfg.Interval, r.logger, "reconciler", func(ctx context.Context) error {
		_, err := r.RunOnce(ctx)
		return err
	})
}

// ReconcileRound counts what one round did: orders settled or resumed
// (Changed, Unchanged, Failed), orphan PaymentIntents canceled by the
// sweep (Orphans; a failed sweep counts in Failed), and the stray payments
// whose refund Stripe has still not said succeeded (StrayUnreturned).
type ReconcileRound struct {
	Changed, Unchanged, Failed int
	Orphans                    int
	StrayUnreturned            int
}

// StrayReturner is implemented by an OrderReconciler that also returns
// stray payments (*checkout.Service): each round, ReturnStrayPayments
// sends the refund of every stray payment Stripe has not refunded yet
// again (under its next attempt's key once Stripe failed the last), sets
// the metrics of the money not returned, and returns how many are not.
type StrayReturner interface {
	ReturnStrayPayments(ctx context.Context) (unreturned int, err error)
}

// RunOnce runs one round and refreshes the gauges. An order's failure is
// counted and logged, not returned; the error is for the round itself.
func (r *Reconciler) RunOnce(ctx context.Context) (ReconcileRound, error) {
	var round ReconcileRound
	actions, err := r.actionsPage(ctx)
	if err != nil {
		return round, err
	}
	now := r.cfg.Now()
	keys, err := r.unknownPayments(ctx, now)
	if err != nil {
		return round, fmt.Errorf("list orders with an unknown payment: %w", err)
	}
	sweeps, err := r.orphanSweeps(ctx, now)
	if err != nil {
		return round, fmt.Errorf("list orders to sweep for orphans: %w", err)
	}

	var mu sync.Mutex
	count := func(changed bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		res := ResultUnchanged
		switch {
		case err != nil:
			res = ResultFailed
			round.Failed++
		case changed:
			res = ResultChanged
			round.Changed++
		default:
			round.Unchanged++
		}
		r.ordersTotal.WithLabelValues(res).Inc()
	}
	g := new(errgroup.Group)
	g.SetLimit(r.cfg.Concurrency)
	for _, o := range actions {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OrderTimeout)
			defer cancel()
			changed, err := r.svc.ReconcileOrder(octx, o.TenantID, o.ID)
			if err != nil {
				r.logger.Warn("reconcile order in requires_action", "order_id", o.ID, "err", err)
			} else if changed {
				r.logger.Info("reconciled order in requires_action", "order_id", o.ID)
			}
			count(changed, err)
			return nil
		})
	}
	for _, id := range keys {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OrderTimeout)
			defer cancel()
			done, err := r.svc.Complete(octx, id)
			if err != nil {
				r.logger.Warn("reconcile order with an unknown payment", "key_id", id, "err", err)
			}
			count(done, err)
			return nil
		})
	}
	for _, o := range sweeps {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OrderTimeout)
			defer cancel()
			n, err := r.svc.SweepOrphans(octx, o.TenantID, o.ID)
			mu.Lock()
			defer mu.Unlock()
			round.Orphans += n
			r.orphans.Add(float64(n))
			if err != nil {
				round.Failed++
				r.ordersTotal.WithLabelValues(ResultFailed).Inc()
				r.logger.Warn("sweep orphan PaymentIntents", "order_id", o.ID, "err", err)
			}
			return nil
		})
	}
	g.Wait() // the goroutines report through round

	if sr, ok := r.svc.(StrayReturner); ok && ctx.Err() == nil {
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OrderTimeout)
		n, err := sr.ReturnStrayPayments(octx)
		cancel()
		if err != nil {
			r.logger.Warn("return stray payments", "err", err)
		}
		round.StrayUnreturned = n
	}

	n, err := orders.Count(ctx, r.db, orders.PaymentUnknown, orders.RequiresAction)
	if err != nil {
		return round, fmt.Errorf("count open payments: %w", err)
	}
	r.unknown.Set(float64(n[orders.PaymentUnknown]))
	r.requiresAction.Set(float64(n[orders.RequiresAction]))
	return round, nil
}

// actionsPage lists up to BatchSize orders in requires_action for this
// round, walking through them all across rounds: each round starts after
// the last order the previous round listed, and starts over once a page
// comes back short. An order whose reconciliation keeps failing does not
// change, so a page of the oldest would list the same ones every round
// and hide every order behind them (and their PAYMENT_ACTION_TIMEOUT and
// stock) until a webhook came; walking on, every order is polled at least
// once every ceil(n/BatchSize)+1 rounds, n being how many wait.
func (r *Reconciler) actionsPage(ctx context.Context) ([]orders.Ref, error) {
	r.actionsMu.Lock()
	defer r.actionsMu.Unlock()
	page, next, err := orders.InStatus(ctx, r.db, orders.RequiresAction, r.actionsAfter, r.cfg.BatchSize)
	if err != nil {
		return nil, err
	}
	r.actionsAfter = next
	if len(page) < r.cfg.BatchSize {
		r.actionsAfter = orders.Position{} // the end: the next round starts over
	}
	return page, nil
}
