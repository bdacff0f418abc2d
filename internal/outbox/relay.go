package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/tracing"
)

// Publisher is what the relay needs of the broker; *rabbitmq.Publisher is
// the implementation.
//
// Publish returns one error per message, in order. nil means the broker
// confirmed the message and is now responsible for it, having routed it to
// a queue; anything else means it may or may not have arrived, or reached
// no queue (rabbitmq.ErrUnroutable: the queue was deleted), and the relay
// publishes it again later. A Publisher that confirmed an unroutable
// message would have the relay mark an event published that nobody got.
// Publish must return within a bounded time even if the broker goes silent.
type Publisher interface {
	Publish(ctx context.Context, msgs []rabbitmq.Message) []error
}

var _ Publisher = (*rabbitmq.Publisher)(nil)

// sender is what a Publisher may add: Send sends at once and returns the
// wait for the confirms, so the relay can claim its next batch while the
// broker confirms this one, and batches still go out in claim order.
// *rabbitmq.Publisher has it; a Publisher without it is called with
// Publish from the batch's own goroutine.
type sender interface {
	Send(ctx context.Context, msgs []rabbitmq.Message) (wait func() []error)
}

var _ sender = (*rabbitmq.Publisher)(nil)

// RelayConfig configures a Relay. Zero values get the defaults shown.
type RelayConfig struct {
	// PollInterval is the longest wait between polls of an idle outbox, and
	// the wait after an error (1s).
	PollInterval time.Duration
	// MinPoll is the shortest (5ms). Each poll that finds nothing doubles
	// the wait up to PollInterval; a poll that finds rows brings it back to
	// MinPoll. Under load the relay polls every few milliseconds, each poll
	// one index probe; idle, once every PollInterval. At 1ms a loaded relay
	// claimed about one row per transaction of three round trips; 5ms took
	// the dispatcher's CPU per checkout from 0.34 to 0.26 ms (medians of 5
	// alternating runs of make bench's 16-client point, 2026-12-04) and
	// added about 2.5 ms, half the interval, to the paced point's
	// commit-to-confirm p50 (7.3 to 9.8 ms, medians of 4 alternating runs);
	// its p99 over a bare publisher's moved less than the runs' noise.
	MinPoll time.Duration
	// BatchSize is how many rows one transaction claims (100).
	BatchSize int
	// InFlight is how many claimed batches may wait for their confirms at
	// once (4), each in its own transaction: the relay claims and sends the
	// next batch while the broker confirms the previous ones.
	InFlight int
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
// rows, publishes them with confirms, and commits the confirmed ones as
// published in the same transaction (the mark is written with the claim and
// committed only after the confirms; rows not confirmed are put back).
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
	if cfg.MinPoll <= 0 {
		cfg.MinPoll = 5 * time.Millisecond
	}
	if cfg.MinPoll > cfg.PollInterval {
		cfg.MinPoll = cfg.PollInterval
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 100
	}
	if cfg.InFlight <= 0 {
		cfg.InFlight = 4
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
			Name: "checkout_outbox_publish_lag_seconds",
			Help: "Time from an event's commit (occurred_at) to its broker confirm.",
			// Fine from 1 to 100 ms, where a healthy relay's p99 lies: a
			// quantile is interpolated within its bucket, and one bucket
			// from 25 to 50 ms made any p99 in it a guess by up to 25 ms.
			Buckets: []float64{.001, .002, .003, .005, .0075, .01, .015, .02, .025, .03, .04, .05, .075, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_outbox_publish_failures_total",
			Help: "Publish attempts that got a nack, a timeout, a channel error or a return (no queue); the row is retried later.",
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

// Run relays until ctx ends. It polls adaptively (MinPoll to PollInterval:
// no LISTEN/NOTIFY, whose commit-time lock serialized every checkout until
// migration 00003 dropped the trigger), drains full batches back
// to back, and keeps up to InFlight batches waiting for their confirms
// while it claims the next. When ctx ends it finishes the batches in flight
// (within BatchTimeout) and returns nil. Database and
// broker errors are logged and retried; they never end Run.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, r.cfg.InFlight)
	idle := r.cfg.MinPoll
	var gauges time.Time
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		b, err := r.claim(ctx, idle > r.cfg.MinPoll || gauges.IsZero())
		if err != nil {
			<-slots
			r.logger.Warn("outbox: relay batch failed", "err", err)
			idle = r.cfg.PollInterval
		} else if b != nil {
			r.send(b)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				if err := r.finish(b); err != nil {
					r.logger.Warn("outbox: relay batch failed", "err", err)
				}
			}()
			idle = r.cfg.MinPoll
			if len(b.rows) == r.cfg.BatchSize {
				continue // more are due: claim again at once
			}
		} else {
			<-slots
			idle = min(2*idle, r.cfg.PollInterval)
		}
		if time.Since(gauges) >= r.cfg.PollInterval {
			r.updateGauges(ctx)
			gauges = time.Now()
		}
		timer := time.NewTimer(idle)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// row is one claimed outbox row.
type row struct {
	Seq        int64
	ID         string
	Type       string
	Payload    []byte
	Attempts   int
	OccurredAt time.Time
	// TraceParent is the span that wrote the event, "" when none did.
	TraceParent string
}

// batch is claimed rows, locked by their open transaction until finish.
type batch struct {
	ctx    context.Context
	cancel context.CancelFunc
	tx     *gorm.DB
	rows   []row
	wait   func() []error
	// spans are the rows' publish spans (nil for a row without a trace),
	// ended by finish with the confirm's outcome.
	spans []trace.Span
}

// RelayBatch claims up to BatchSize due rows, publishes them, waits for the
// confirms and, in the same transaction, commits the confirmed rows as
// published and reschedules the others with backoff. It returns how many rows it
// claimed (published or not). It runs on a context detached from ctx's
// cancellation, bounded by BatchTimeout, so a shutdown finishes the batch
// instead of re-publishing it later. Run does the same with several batches
// in flight.
func (r *Relay) RelayBatch(ctx context.Context) (claimed int, err error) {
	b, err := r.claim(ctx, false)
	if err != nil || b == nil {
		return 0, err
	}
	r.send(b)
	return len(b.rows), r.finish(b)
}

// claim opens a transaction and, in one statement, locks up to BatchSize
// due rows (FOR UPDATE SKIP LOCKED, so batches in flight and other relays
// are skipped) and writes their published mark. The mark is part of the
// transaction, which finish commits only after the broker's confirms: until
// then no one sees it, and a rollback (a crash, a failed confirm wait) leaves
// the rows unpublished. One statement instead of a claim and a later UPDATE
// of the same rows halves what PostgreSQL does per row. It returns nil,
// with the transaction ended, when none is due. With probe, a cheap query
// outside any transaction answers an empty poll first (the idle relay's
// polls), in one round trip instead of three.
func (r *Relay) claim(ctx context.Context, probe bool) (*batch, error) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
	if probe {
		var due bool
		if err := r.db.WithContext(bctx).Raw(`SELECT EXISTS (SELECT 1 FROM outbox
			WHERE published_at IS NULL AND next_attempt_at <= now())`).Row().Scan(&due); err != nil {
			cancel()
			return nil, fmt.Errorf("outbox: relay: probe: %w", err)
		}
		if !due {
			cancel()
			return nil, nil
		}
	}
	tx := r.db.WithContext(bctx).Begin()
	if tx.Error != nil {
		cancel()
		return nil, fmt.Errorf("outbox: relay: begin: %w", tx.Error)
	}
	rows, err := r.claimRows(tx)
	if err != nil {
		tx.Rollback()
		cancel()
		return nil, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	if len(rows) == 0 {
		tx.Rollback()
		cancel()
		return nil, nil
	}
	return &batch{ctx: bctx, cancel: cancel, tx: tx, rows: rows}, nil
}

// claimRows locks and marks the batch's rows in tx and returns them in seq
// order (RETURNING follows the primary key's order, not seq's). It scans by
// hand: GORM's reflection over 500 rows a batch was a visible part of the
// dispatcher's CPU.
func (r *Relay) claimRows(tx *gorm.DB) ([]row, error) {
	// set_config makes the batch's commit asynchronous (it need not wait for
	// its WAL to reach disk): the events are already durable, their own
	// transactions committed them, and a mark lost to a PostgreSQL crash
	// only publishes the rows again, which at-least-once delivery allows.
	// It saves a disk flush per batch, in this statement, not a round trip.
	rs, err := tx.Raw(`UPDATE outbox SET published_at = now(), last_error = NULL
		FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
		WHERE id = ANY(ARRAY(SELECT id FROM outbox
			WHERE published_at IS NULL AND next_attempt_at <= now()
			ORDER BY seq
			LIMIT ?
			FOR UPDATE SKIP LOCKED))
		AND published_at IS NULL
		RETURNING seq, id, type, payload::text, attempts, occurred_at, coalesce(traceparent, '')`, r.cfg.BatchSize).Rows()
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	rows := make([]row, 0, r.cfg.BatchSize)
	for rs.Next() {
		var rw row
		if err := rs.Scan(&rw.Seq, &rw.ID, &rw.Type, &rw.Payload, &rw.Attempts, &rw.OccurredAt, &rw.TraceParent); err != nil {
			return nil, err
		}
		rows = append(rows, rw)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(a.Seq, b.Seq) })
	return rows, nil
}

// send publishes b's rows: at once when the publisher can send without
// waiting, else in the wait. A row written inside a trace is published
// as a child span of the span that wrote it, whose traceparent goes in the
// message's headers (internal/tracing says why a child, not a link).
func (r *Relay) send(b *batch) {
	msgs := make([]rabbitmq.Message, len(b.rows))
	b.spans = make([]trace.Span, len(b.rows))
	for i, rw := range b.rows {
		msgs[i] = rabbitmq.Message{
			MessageID:   rw.ID,
			RoutingKey:  rw.Type,
			ContentType: "application/json",
			Body:        rw.Payload,
			Timestamp:   rw.OccurredAt,
		}
		if rw.TraceParent != "" {
			ctx, span := tracing.Start(tracing.WithTraceParent(b.ctx, rw.TraceParent), "checkout.events publish",
				trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
					tracing.AttrEventID.String(rw.ID), tracing.AttrEventType.String(rw.Type),
					attribute.Int("checkout.outbox.attempts", rw.Attempts+1)))
			msgs[i].Headers = amqp.Table{}
			tracing.InjectHeaders(ctx, msgs[i].Headers)
			b.spans[i] = span
		}
	}
	if s, ok := r.pub.(sender); ok {
		b.wait = s.Send(b.ctx, msgs)
		return
	}
	b.wait = func() []error { return r.pub.Publish(b.ctx, msgs) }
}

// finish waits for b's confirms, then puts the rows that were not
// confirmed back (unpublished, rescheduled with backoff), and commits,
// which is when the confirmed rows' published mark (written by claim)
// becomes visible. On any error it rolls back, so every row of b is
// published again later.
func (r *Relay) finish(b *batch) (err error) {
	defer b.cancel()
	defer func() {
		for _, span := range b.spans {
			if span != nil { // not reached: the batch failed before its confirms were read
				tracing.End(span, err)
			}
		}
		if err != nil {
			b.tx.Rollback()
			err = fmt.Errorf("outbox: relay: %w", err)
		}
	}()
	errs := b.wait()
	if r.afterConfirm != nil {
		if err := r.afterConfirm(b.ctx); err != nil {
			return err
		}
	}
	confirmedAt := time.Now()
	failed := 0
	for i, perr := range errs {
		rw := b.rows[i]
		span := b.spans[i]
		if span != nil {
			tracing.End(span, perr)
			b.spans[i] = nil
		}
		if perr == nil {
			// With the publish span's trace as the exemplar: a slow
			// bucket leads to the checkout whose event waited.
			ctx := b.ctx
			if span != nil {
				ctx = trace.ContextWithSpan(ctx, span)
			}
			tracing.Observe(ctx, r.lag, confirmedAt.Sub(rw.OccurredAt).Seconds())
			continue
		}
		failed++
		delay := r.retryDelay(rw.Attempts + 1)
		r.logger.Warn("outbox: publish failed", "id", rw.ID, "type", rw.Type,
			"attempts", rw.Attempts+1, "retry_in", delay, "err", perr)
		if err := b.tx.Exec(`UPDATE outbox
			SET published_at = NULL, attempts = attempts + 1, last_error = ?, next_attempt_at = now() + ?::interval
			WHERE id = ?`, truncate(perr.Error(), 1000), delay.String(), rw.ID).Error; err != nil {
			return fmt.Errorf("reschedule %s: %w", rw.ID, err)
		}
	}
	if err := b.tx.Commit().Error; err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	r.published.Add(float64(len(errs) - failed))
	r.failures.Add(float64(failed))
	return nil
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
