package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

// Publisher is what the relay needs of the broker; *rabbitmq.Publisher is
// the implementation.
//
// Publish returns one error per message, in order. nil means the broker
// confirmed the message and is now responsible for it; anything else means
// it may or may not have arrived, and the relay publishes it again later.
// Publish must return within a bounded time even if the broker goes silent.
type Publisher interface {
	Publish(ctx context.Context, msgs []rabbitmq.Message) []error
}

var _ Publisher = (*rabbitmq.Publisher)(nil)

// RelayConfig configures a Relay. Zero values get the defaults shown.
type RelayConfig struct {
	// ListenURL is the database URL of a dedicated connection that LISTENs
	// on the "outbox" channel, so that a commit wakes the relay at once.
	// Empty: no LISTEN, the relay only polls.
	ListenURL string
	// PollInterval is the fallback poll, and the wait after an error (1s).
	PollInterval time.Duration
	// BatchSize is how many rows one transaction claims (100).
	BatchSize int
	// MinRetry and MaxRetry bound the exponential delay before a row whose
	// publish failed is tried again (1s, 5m): MinRetry·2^(attempts-1).
	MinRetry, MaxRetry time.Duration
	// BatchTimeout bounds one batch: claim, publish, confirm, mark (20s).
	BatchTimeout time.Duration
	// Logger (default: discard).
	Logger *slog.Logger
	// Registerer receives the relay's metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Relay moves outbox rows to the broker: it claims a batch of unpublished
// rows, publishes them with confirms, and marks the confirmed ones published
// in the same transaction.
//
// Delivery is at least once. A crash after the confirm and before the commit
// leaves the rows unpublished, so they are published again with the same
// message_id (consumers deduplicate with the inbox). Rows are claimed with
// FOR UPDATE SKIP LOCKED, so any number of relays may run at once without
// publishing the same row concurrently, and a row is never skipped, since the
// relay selects by published_at IS NULL rather than by a high-water mark.
// Order is by seq within a batch, but a failed row is retried later while
// the rows behind it go on, so consumers must not rely on order.
type Relay struct {
	db     *gorm.DB
	pub    Publisher
	cfg    RelayConfig
	logger *slog.Logger

	pending       prometheus.Gauge
	oldestPending prometheus.Gauge
	published     prometheus.Counter
	lag           prometheus.Histogram
	failures      prometheus.Counter

	// afterConfirm, when set by tests, runs after the confirms and before
	// the rows are marked; an error rolls the batch back, like a crash.
	afterConfirm func(ctx context.Context) error
}

// NewRelay returns a relay from db's outbox to pub. It returns an error if
// the metrics cannot be registered (e.g. twice on one Registerer).
func NewRelay(db *gorm.DB, pub Publisher, cfg RelayConfig) (*Relay, error) {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 100
	}
	if cfg.MinRetry <= 0 {
		cfg.MinRetry = time.Second
	}
	if cfg.MaxRetry <= 0 {
		cfg.MaxRetry = 5 * time.Minute
	}
	if cfg.BatchTimeout <= 0 {
		cfg.BatchTimeout = 20 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Relay{
		db: db, pub: pub, cfg: cfg, logger: logger,
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "checkout_outbox_pending",
			Help: "Outbox rows not yet published, as of the relay's last check.",
		}),
		oldestPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "checkout_outbox_oldest_pending_age_seconds",
			Help: "Age of the oldest unpublished outbox row (0 when none), as of the relay's last check.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_outbox_published_total",
			Help: "Outbox rows published with a broker confirm and marked published by this process.",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "checkout_outbox_publish_lag_seconds",
			Help:    "Time from an event's commit (occurred_at) to its broker confirm.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_outbox_publish_failures_total",
			Help: "Publish attempts that got a nack, a timeout or a channel error; the row is retried later.",
		}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.pending, r.oldestPending, r.published, r.lag, r.failures} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("outbox: register metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run relays until ctx ends. It wakes on a NOTIFY from the outbox trigger or
// every PollInterval, and drains full batches back to back. When ctx ends it
// finishes the batch in flight (within BatchTimeout), stops its listener and
// returns nil. Database and broker errors are logged and retried; they never
// end Run.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.cfg.ListenURL != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(ctx, wake)
		}()
	}
	ticker := time.NewTicker(r.cfg.PollInterval)
	defer ticker.Stop()
	for {
		for ctx.Err() == nil {
			n, err := r.RelayBatch(ctx)
			if err != nil {
				r.logger.Warn("outbox: relay batch failed", "err", err)
				break
			}
			if n < r.cfg.BatchSize {
				break
			}
		}
		r.updateGauges(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-ticker.C:
		}
	}
}

// row is one claimed outbox row.
type row struct {
	ID         string
	Type       string
	Payload    string
	Attempts   int
	OccurredAt time.Time
}

// RelayBatch claims up to BatchSize due rows, publishes them, waits for the
// confirms and, in the same transaction, marks the confirmed rows published
// and reschedules the others with backoff. It returns how many rows it
// claimed (published or not). It runs on a context detached from ctx's
// cancellation, bounded by BatchTimeout, so a shutdown finishes the batch
// instead of re-publishing it later.
func (r *Relay) RelayBatch(ctx context.Context) (claimed int, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
	defer cancel()
	var ok, failed int
	err = postgres.WithTx(ctx, r.db, func(tx *gorm.DB) error {
		var rows []row
		if err := tx.Raw(`SELECT id, type, payload::text AS payload, attempts, occurred_at
			FROM outbox
			WHERE published_at IS NULL AND next_attempt_at <= now()
			ORDER BY seq
			LIMIT ?
			FOR UPDATE SKIP LOCKED`, r.cfg.BatchSize).Scan(&rows).Error; err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		claimed = len(rows)
		if claimed == 0 {
			return nil
		}
		msgs := make([]rabbitmq.Message, len(rows))
		for i, rw := range rows {
			msgs[i] = rabbitmq.Message{
				MessageID:   rw.ID,
				RoutingKey:  rw.Type,
				ContentType: "application/json",
				Body:        []byte(rw.Payload),
				Timestamp:   rw.OccurredAt,
			}
		}
		errs := r.pub.Publish(ctx, msgs)
		if r.afterConfirm != nil {
			if err := r.afterConfirm(ctx); err != nil {
				return err
			}
		}

		var confirmed []string
		confirmedAt := time.Now()
		for i, perr := range errs {
			if perr == nil {
				confirmed = append(confirmed, rows[i].ID)
				r.lag.Observe(confirmedAt.Sub(rows[i].OccurredAt).Seconds())
				continue
			}
			failed++
			delay := r.retryDelay(rows[i].Attempts + 1)
			r.logger.Warn("outbox: publish failed", "id", rows[i].ID, "type", rows[i].Type,
				"attempts", rows[i].Attempts+1, "retry_in", delay, "err", perr)
			if err := tx.Exec(`UPDATE outbox
				SET attempts = attempts + 1, last_error = ?, next_attempt_at = now() + ?::interval
				WHERE id = ?`, truncate(perr.Error(), 1000), delay.String(), rows[i].ID).Error; err != nil {
				return fmt.Errorf("reschedule %s: %w", rows[i].ID, err)
			}
		}
		if len(confirmed) > 0 {
			if err := tx.Exec(`UPDATE outbox SET published_at = now(), last_error = NULL
				WHERE id IN ? AND published_at IS NULL`, confirmed).Error; err != nil {
				return fmt.Errorf("mark published: %w", err)
			}
		}
		ok = len(confirmed)
		return nil
	})
	if err != nil {
		return claimed, fmt.Errorf("outbox: relay: %w", err)
	}
	r.published.Add(float64(ok))
	r.failures.Add(float64(failed))
	return claimed, nil
}

// retryDelay is MinRetry·2^(attempts-1), capped at MaxRetry.
func (r *Relay) retryDelay(attempts int) time.Duration {
	d := r.cfg.MinRetry
	for i := 1; i < attempts && d < r.cfg.MaxRetry; i++ {
		d *= 2
	}
	return min(d, r.cfg.MaxRetry)
}

// updateGauges refreshes the pending gauges with one query.
func (r *Relay) updateGauges(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	var s struct {
		Pending int64
		Oldest  float64
	}
	err := r.db.WithContext(ctx).Raw(`SELECT count(*) AS pending,
		coalesce(extract(epoch FROM now() - min(occurred_at)), 0)::float8 AS oldest
		FROM outbox WHERE published_at IS NULL`).Scan(&s).Error
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("outbox: pending gauges", "err", err)
		}
		return
	}
	r.pending.Set(float64(s.Pending))
	r.oldestPending.Set(s.Oldest)
}

// listen keeps a LISTEN outbox connection and turns each notification into a
// non-blocking wake. It reconnects after errors; polling covers the gaps.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	for {
		err := r.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		r.logger.Warn("outbox: listen failed, polling until it reconnects", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.PollInterval):
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := pgx.Connect(ctx, r.cfg.ListenURL)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN outbox"); err != nil {
		return err
	}
	for {
		// Also wakes once right after (re)connecting, for commits missed
		// while not listening.
		select {
		case wake <- struct{}{}:
		default:
		}
		if _, err := conn.WaitForNotification(ctx); err != nil {
			if errors.Is(err, context.Canceled) || ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
