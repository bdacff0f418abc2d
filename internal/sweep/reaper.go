package sweep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/inbox"
	"github.com/onceonly/checkout/internal/outbox"
)

// Tables the Reaper deletes from; the values of checkout_reaper_deleted_total's
// table label.
const (
	TableIdempotencyKeys = "idempotency_keys"
	TableInbox           = "inbox"
	TableOutbox          = "outbox"
)

// ReaperConfig configures a Reaper. Zero fields take the defaults named in
// their comments.
type ReaperConfig struct {
	// Interval is the pause between two rounds (env REAPER_INTERVAL,
	// default 1m).
	Interval time.Duration
	// BatchSize is the most rows one DELETE statement removes (default
	// 500). Each statement is its own short transaction, so a request that
	// needs one of the rows waits for one batch at most.
	BatchSize int
	// InboxRetention is how long an inbox row is kept after it was received
	// (env INBOX_RETENTION, default 168h). A message redelivered or
	// re-published after it is processed again, so it must exceed the
	// longest redelivery delay of the broker and the outbox relay.
	InboxRetention time.Duration
	// OutboxRetention is how long a published outbox row is kept for
	// inspection and manual replay (env OUTBOX_RETENTION, default 168h).
	// Unpublished rows are never deleted.
	OutboxRetention time.Duration
	// Logger receives a line per round that deleted something, and errors
	// (default: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now). Finished idempotency keys are
	// deleted once their expires_at (IDEMPOTENCY_TTL after the key
	// finished) is before it; unfinished keys have none and stay.
	Now func() time.Time
}

// Reaper deletes rows past their retention in small batches: finished
// idempotency keys past their expires_at, IDEMPOTENCY_TTL after their final
// answer (never an unfinished one, whatever its age: idempotency.Reap), inbox
// rows older than InboxRetention and published outbox rows older than
// OutboxRetention (never an unpublished one). Create it with NewReaper.
//
// Rows are picked with FOR UPDATE SKIP LOCKED, so the Reaper never waits for
// a request holding a row, and several reapers share the work.
type Reaper struct {
	db      *gorm.DB
	cfg     ReaperConfig
	logger  *slog.Logger
	deleted *prometheus.CounterVec
}

// NewReaper returns a Reaper over db. It registers, on cfg.Registerer:
//
//	checkout_reaper_deleted_total{table}   rows deleted, by table (idempotency_keys, inbox, outbox)
//
// It returns an error if the metrics cannot be registered (e.g. twice on one
// Registerer).
func NewReaper(db *gorm.DB, cfg ReaperConfig) (*Reaper, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	if cfg.InboxRetention <= 0 {
		cfg.InboxRetention = 7 * 24 * time.Hour
	}
	if cfg.OutboxRetention <= 0 {
		cfg.OutboxRetention = 7 * 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Reaper{
		db: db, cfg: cfg, logger: logger,
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_reaper_deleted_total",
			Help: "Rows the reaper deleted past their retention, by table (idempotency_keys, inbox, outbox).",
		}, []string{"table"}),
	}
	for _, t := range []string{TableIdempotencyKeys, TableInbox, TableOutbox} {
		r.deleted.WithLabelValues(t)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(r.deleted); err != nil {
			return nil, fmt.Errorf("reaper: register metrics: %w", err)
		}
	}
	return r, nil
}

// Run runs a round at once and then every Interval until ctx ends, and
// returns nil after the statement in flight. Errors are logged and retried
// in the next round; they never end Run.
func (r *Reaper) Run(ctx context.Context) error {
	return every(ctx, r.cfg.Interval, r.logger, "reaper", func(ctx context.Context) error {
		res, err := r.RunOnce(ctx)
		if n := res.Keys.Deleted + res.Inbox.Deleted + res.Outbox.Deleted; n > 0 {
			r.logger.Info("reaped expired rows", "idempotency_keys", res.Keys.Deleted,
				"inbox", res.Inbox.Deleted, "outbox", res.Outbox.Deleted)
		}
		return err
	})
}

// TableReap is what one round did to one table.
type TableReap struct {
	// Deleted is the number of rows deleted.
	Deleted int64
	// Statements is the number of DELETE statements (transactions) issued:
	// the batches, including the last, short one.
	Statements int
}

// Reap is what one round did, by table.
type Reap struct {
	Keys, Inbox, Outbox TableReap
}

// RunOnce runs one round: for each table it deletes batches until one comes
// back short (or ctx ends), so everything past retention at the start of
// the round is gone unless another transaction held it. The error joins
// each table's failure; the tables are independent, so one failing does not
// stop the others, and rows deleted before a failure stay deleted.
func (r *Reaper) RunOnce(ctx context.Context) (Reap, error) {
	now := r.cfg.Now()
	var (
		res  Reap
		errs []error
	)
	// Each table's owner deletes its rows a batch per statement
	// (idempotency.Reap, inbox.Reap, outbox.Reap), with FOR UPDATE SKIP
	// LOCKED: a row a request holds is left for the next round instead of
	// making the reaper (and everyone queued behind it) wait.
	res.Keys, errs = r.reap(ctx, TableIdempotencyKeys, errs, func(ctx context.Context, limit int) (int64, error) {
		return idempotency.Reap(ctx, r.db, now, limit)
	})
	res.Inbox, errs = r.reap(ctx, TableInbox, errs, func(ctx context.Context, limit int) (int64, error) {
		return inbox.Reap(ctx, r.db, now.Add(-r.cfg.InboxRetention), limit)
	})
	res.Outbox, errs = r.reap(ctx, TableOutbox, errs, func(ctx context.Context, limit int) (int64, error) {
		return outbox.Reap(ctx, r.db, now.Add(-r.cfg.OutboxRetention), limit)
	})
	return res, errors.Join(errs...)
}

// reap runs batch, which deletes up to its limit rows and returns how
// many, until a batch deletes fewer than BatchSize rows. Every statement
// runs outside any transaction of ours, so each is committed on its own.
func (r *Reaper) reap(ctx context.Context, table string, errs []error, batch func(ctx context.Context, limit int) (int64, error)) (TableReap, []error) {
	var t TableReap
	for ctx.Err() == nil {
		n, err := batch(ctx, r.cfg.BatchSize)
		if err != nil {
			return t, append(errs, fmt.Errorf("reap %s: %w", table, err))
		}
		t.Statements++
		t.Deleted += n
		r.deleted.WithLabelValues(table).Add(float64(n))
		if n < int64(r.cfg.BatchSize) {
			break
		}
	}
	return t, errs
}
