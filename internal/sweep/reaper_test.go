package sweep_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/sweep"
)

// reaperEnv is one test's database, a reaper over it with a fixed clock,
// and the reaper's metrics.
type reaperEnv struct {
	t      testing.TB
	db     *gorm.DB
	now    time.Time
	reaper *sweep.Reaper
	reg    *prometheus.Registry
}

func setupReaper(t testing.TB) *reaperEnv {
	t.Helper()
	e := &reaperEnv{t: t, now: time.Now().UTC().Truncate(time.Microsecond), reg: prometheus.NewRegistry()}
	e.db, _ = pgtest.NewDB(t)
	var err error
	e.reaper, err = sweep.NewReaper(e.db, sweep.ReaperConfig{
		Registerer: e.reg,
		Now:        func() time.Time { return e.now },
	})
	require.NoError(t, err)
	return e
}

// keys inserts n idempotency keys named prefix-1..n at recoveryPoint.
// Finished keys expire at expiresAt; unfinished keys have a dead owner's
// expired lease and, as the store writes them, no end of retention
// (expiresAt is ignored).
func (e *reaperEnv) keys(prefix string, n int, recoveryPoint string, expiresAt time.Time) {
	e.t.Helper()
	var (
		leaseOwner     *string
		leaseExpiresAt *time.Time
		status         *int
		finishedAt     *time.Time
		expires        *time.Time
	)
	if recoveryPoint == "finished" {
		status, finishedAt, expires = new(201), ago(e.now, 47*time.Hour), &expiresAt
	} else {
		leaseOwner, leaseExpiresAt = new("dead"), ago(e.now, 47*time.Hour)
	}
	require.NoError(e.t, e.db.Exec(`
		INSERT INTO idempotency_keys (tenant_id, route, key, fingerprint, recovery_point,
		  lease_owner, lease_expires_at, response_status, created_at, updated_at, finished_at, expires_at)
		SELECT 'acme', 'POST /v1/checkouts', ? || '-' || g, 'fp', ?, ?, ?, ?, ?, ?, ?, ?
		FROM generate_series(1, ?) g`,
		prefix, recoveryPoint, leaseOwner, leaseExpiresAt, status,
		e.now.Add(-48*time.Hour), e.now.Add(-48*time.Hour), finishedAt, expires, n).Error)
}

// inbox inserts n inbox rows named prefix-1..n received at receivedAt.
func (e *reaperEnv) inbox(prefix string, n int, receivedAt time.Time) {
	e.t.Helper()
	require.NoError(e.t, e.db.Exec(`
		INSERT INTO inbox (consumer, message_id, received_at)
		SELECT 'notify', ? || '-' || g, ? FROM generate_series(1, ?) g`,
		prefix, receivedAt, n).Error)
}

// outbox inserts n outbox rows named prefix-1..n that occurred at
// occurredAt and were published at publishedAt (nil: not published).
func (e *reaperEnv) outbox(prefix string, n int, occurredAt time.Time, publishedAt *time.Time) {
	e.t.Helper()
	require.NoError(e.t, e.db.Exec(`
		INSERT INTO outbox (id, tenant_id, aggregate_id, type, payload, occurred_at, published_at)
		SELECT ? || '-' || g, 'acme', 'ord_' || g, 'order.paid', '{}', ?, ? FROM generate_series(1, ?) g`,
		prefix, occurredAt, publishedAt, n).Error)
}

func (e *reaperEnv) count(query string, args ...any) int {
	e.t.Helper()
	return count(e.t, e.db, query, args...)
}

func (e *reaperEnv) deleted(table string) float64 {
	e.t.Helper()
	return metric(e.t, e.reg, "checkout_reaper_deleted_total", "table", table)
}

func ago(now time.Time, d time.Duration) *time.Time {
	t := now.Add(-d)
	return &t
}

// TestReaperDeletesOnlyPastRetention: on a seeded database the reaper
// deletes exactly the finished keys past their TTL, the inbox rows and the
// published outbox rows past retention, in batches of 500, and nothing else.
func TestReaperDeletesOnlyPastRetention(t *testing.T) {
	t.Parallel()
	e := setupReaper(t)
	const day = 24 * time.Hour
	e.keys("expired", 2000, "finished", e.now.Add(-time.Hour))
	e.keys("fresh", 50, "finished", e.now.Add(time.Hour))
	e.keys("unfinished", 30, "order_created", e.now.Add(-time.Hour)) // never deleted, whatever their age
	e.inbox("old", 700, e.now.Add(-8*day))
	e.inbox("new", 40, e.now.Add(-6*day))
	e.outbox("published-old", 1200, e.now.Add(-8*day), ago(e.now, 8*day))
	e.outbox("published-new", 60, e.now.Add(-8*day), ago(e.now, 6*day))
	e.outbox("unpublished-old", 25, e.now.Add(-30*day), nil)

	res, err := e.reaper.RunOnce(context.Background())
	require.NoError(t, err)
	// Full batches, then one short batch that ends the table's loop.
	require.Equal(t, sweep.Reap{
		Keys:   sweep.TableReap{Deleted: 2000, Statements: 5},
		Inbox:  sweep.TableReap{Deleted: 700, Statements: 2},
		Outbox: sweep.TableReap{Deleted: 1200, Statements: 3},
	}, res)

	require.Equal(t, 0, e.count(`SELECT count(*) FROM idempotency_keys WHERE key LIKE 'expired-%'`))
	require.Equal(t, 50, e.count(`SELECT count(*) FROM idempotency_keys WHERE key LIKE 'fresh-%'`))
	require.Equal(t, 30, e.count(`SELECT count(*) FROM idempotency_keys WHERE key LIKE 'unfinished-%'`))
	require.Equal(t, 80, e.count(`SELECT count(*) FROM idempotency_keys`))
	require.Equal(t, 0, e.count(`SELECT count(*) FROM inbox WHERE message_id LIKE 'old-%'`))
	require.Equal(t, 40, e.count(`SELECT count(*) FROM inbox`))
	require.Equal(t, 0, e.count(`SELECT count(*) FROM outbox WHERE id LIKE 'published-old-%'`))
	require.Equal(t, 60, e.count(`SELECT count(*) FROM outbox WHERE id LIKE 'published-new-%'`))
	require.Equal(t, 25, e.count(`SELECT count(*) FROM outbox WHERE id LIKE 'unpublished-old-%'`))
	require.Equal(t, 85, e.count(`SELECT count(*) FROM outbox`))

	require.EqualValues(t, 2000, e.deleted(sweep.TableIdempotencyKeys))
	require.EqualValues(t, 700, e.deleted(sweep.TableInbox))
	require.EqualValues(t, 1200, e.deleted(sweep.TableOutbox))

	// A second round finds nothing and moves no counter.
	res, err = e.reaper.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Reap{
		Keys: sweep.TableReap{Statements: 1}, Inbox: sweep.TableReap{Statements: 1}, Outbox: sweep.TableReap{Statements: 1},
	}, res)
	require.EqualValues(t, 2000, e.deleted(sweep.TableIdempotencyKeys))
	require.EqualValues(t, 700, e.deleted(sweep.TableInbox))
	require.EqualValues(t, 1200, e.deleted(sweep.TableOutbox))

	// Time passes: the fresh keys and the newer rows reach their retention;
	// the unfinished keys and the unpublished rows still stay.
	e.now = e.now.Add(2 * day)
	res, err = e.reaper.RunOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 50, res.Keys.Deleted)
	require.EqualValues(t, 40, res.Inbox.Deleted)
	require.EqualValues(t, 60, res.Outbox.Deleted)
	require.Equal(t, 30, e.count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'`))
	require.Equal(t, 25, e.count(`SELECT count(*) FROM outbox WHERE published_at IS NULL`))
	require.EqualValues(t, 2050, e.deleted(sweep.TableIdempotencyKeys))
}

// TestReaperKeepsAKeyForTheTTLAfterItFinished: a key claimed by the store,
// left unfinished for twice IDEMPOTENCY_TTL (a Stripe outage) and then
// finished, is kept by the reaper for a whole TTL after it finished, and
// deleted after that. Before, its retention was counted from the claim and
// the reaper deleted it as soon as it finished, so its next retry ran as a
// new request.
func TestReaperKeepsAKeyForTheTTLAfterItFinished(t *testing.T) {
	t.Parallel()
	e := setupReaper(t)
	const ttl = time.Hour
	store := &idempotency.Store{Lease: 30 * time.Second, TTL: ttl, Now: func() time.Time { return e.now }}
	ctx := context.Background()
	sc := idempotency.Scope{Tenant: "acme", Route: "POST /v1/checkouts", Key: "late"}
	var c *idempotency.Claim
	require.NoError(t, postgres.WithTx(ctx, e.db, func(tx *gorm.DB) (err error) {
		c, err = store.Claim(ctx, tx, sc, "fp", "owner")
		return err
	}))

	e.now = e.now.Add(2 * ttl)
	res, err := e.reaper.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Keys.Deleted, "an unfinished key is never reaped")
	require.NoError(t, postgres.WithTx(ctx, e.db, func(tx *gorm.DB) error {
		return store.Finish(ctx, tx, c, idempotency.JSONResponse(201, []byte(`{}`), ""))
	}))

	e.now = e.now.Add(ttl - time.Minute)
	res, err = e.reaper.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Keys.Deleted, "kept for the TTL after its final answer")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM idempotency_keys`))

	e.now = e.now.Add(2 * time.Minute)
	res, err = e.reaper.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Keys.Deleted)
	require.Zero(t, e.count(`SELECT count(*) FROM idempotency_keys`))
}

// TestReaperSkipsLockedRows: rows another transaction holds (a request
// claiming an expired key, the relay on an outbox row) are skipped, not
// waited for: the reaper finishes the rest while the lock is held, and
// deletes them in a later round.
func TestReaperSkipsLockedRows(t *testing.T) {
	t.Parallel()
	e := setupReaper(t)
	e.keys("expired", 1200, "finished", e.now.Add(-time.Hour))
	e.inbox("old", 10, e.now.Add(-30*24*time.Hour))
	e.outbox("published-old", 10, e.now.Add(-30*24*time.Hour), ago(e.now, 30*24*time.Hour))

	tx := e.db.Begin()
	require.NoError(t, tx.Error)
	defer tx.Rollback()
	var lockedKey int64
	require.NoError(t, tx.Raw(`SELECT id FROM idempotency_keys ORDER BY expires_at, id LIMIT 1 FOR UPDATE`).Scan(&lockedKey).Error)
	require.NoError(t, tx.Exec(`SELECT 1 FROM inbox WHERE message_id = 'old-1' FOR UPDATE`).Error)
	require.NoError(t, tx.Exec(`SELECT 1 FROM outbox WHERE id = 'published-old-1' FOR UPDATE`).Error)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := e.reaper.RunOnce(ctx)
	require.NoError(t, err, "the reaper must not wait for the locks")
	require.EqualValues(t, 1199, res.Keys.Deleted)
	require.EqualValues(t, 9, res.Inbox.Deleted)
	require.EqualValues(t, 9, res.Outbox.Deleted)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM idempotency_keys WHERE id = ?`, lockedKey))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM inbox`))
	require.Equal(t, 1, e.count(`SELECT count(*) FROM outbox`))

	require.NoError(t, tx.Commit().Error)
	res, err = e.reaper.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweep.Reap{
		Keys:   sweep.TableReap{Deleted: 1, Statements: 1},
		Inbox:  sweep.TableReap{Deleted: 1, Statements: 1},
		Outbox: sweep.TableReap{Deleted: 1, Statements: 1},
	}, res)
	require.EqualValues(t, 1200, e.deleted(sweep.TableIdempotencyKeys))
}

// TestReaperDoesNotBlockWriters: while the reaper deletes 20,000 keys in
// batches of 500, single-row updates on the rows it is deleting keep
// committing: each waits at most for the batch that holds its row, never
// for the whole round.
func TestReaperDoesNotBlockWriters(t *testing.T) {
	t.Parallel()
	e := setupReaper(t)
	const n = 20000
	e.keys("expired", n, "finished", e.now.Add(-time.Hour))
	var ids []int64
	// The reaper goes oldest first (by expires_at, all equal here, so in
	// index order); the writer takes rows from every part of the table.
	require.NoError(t, e.db.Raw(`SELECT id FROM idempotency_keys ORDER BY random() LIMIT 200`).Scan(&ids).Error)

	var running atomic.Bool
	running.Store(true)
	var (
		during  int           // updates that committed while the reaper ran
		slowest time.Duration // the longest single update
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; running.Load(); i++ {
			start := time.Now()
			err := e.db.Exec(`UPDATE idempotency_keys SET updated_at = now() WHERE id = ?`, ids[i%len(ids)]).Error
			if err != nil {
				t.Errorf("update: %v", err)
				return
			}
			slowest = max(slowest, time.Since(start))
			if running.Load() {
				during++
			}
		}
	}()

	res, err := e.reaper.RunOnce(context.Background())
	running.Store(false)
	<-done
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Keys.Statements, n/500, "one statement, one transaction, per batch")
	require.Positive(t, during, "writers commit while the reaper runs")
	require.Less(t, slowest, 10*time.Second, "a writer waits for one batch at most")

	// The last batch may have skipped the row the writer held at that
	// moment; the next round takes it.
	require.GreaterOrEqual(t, res.Keys.Deleted, int64(n-1))
	again, err := e.reaper.RunOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, n, res.Keys.Deleted+again.Keys.Deleted)
	require.Equal(t, 0, e.count(`SELECT count(*) FROM idempotency_keys`))
	t.Logf("reaper: %d statements; %d concurrent updates, slowest %s", res.Keys.Statements, during, slowest)
}

// TestNewReaperRegistersOnce: a second reaper on the same registry is an
// error, not a panic.
func TestNewReaperRegistersOnce(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, err := sweep.NewReaper(nil, sweep.ReaperConfig{Registerer: reg})
	require.NoError(t, err)
	_, err = sweep.NewReaper(nil, sweep.ReaperConfig{Registerer: reg})
	require.Error(t, err)
}
