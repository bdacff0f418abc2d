package idempotency_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// retentionClock is a clock the test moves; the store and Reap read it.
type retentionClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *retentionClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *retentionClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestRetentionCountsFromTheFinalAnswer: a key that stays unfinished for
// three times IDEMPOTENCY_TTL (a Stripe outage, a parked refund) never
// expires and is never reaped; once it finishes, it replays for a whole TTL
// counted from its final answer, and only then is reaped and new again.
// Both ways a key is claimed and finished are covered: Claim and Finish on
// a transaction (the general path), QueueClaimNew and QueueFinish in a
// batch (the fast path). Before, expires_at was fixed at the claim, so the
// late-finished key was already expired: its next retry ran as a new
// request (a second order and charge), and the reaper could delete it.
func TestRetentionCountsFromTheFinalAnswer(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	const ttl = time.Hour
	clock := &retentionClock{now: time.Now().UTC().Truncate(time.Microsecond)}
	s := &idempotency.Store{Lease: 30 * time.Second, TTL: ttl, Now: clock.Now}

	for _, path := range []string{"transaction", "batch"} {
		t.Run(path, func(t *testing.T) {
			sc := scope
			sc.Key = "retention-" + path
			var first *idempotency.Claim
			if path == "transaction" {
				c, err := claim(t, db, s, sc, "fp", "owner-1", true)
				require.NoError(t, err)
				first = c
			} else {
				var b postgres.Batch
				first = s.QueueClaimNew(&b, sc, "fp", "owner-1", "order_created", "ord_1")
				require.NoError(t, postgres.Send(ctx, db, &b))
			}
			require.True(t, first.New)
			require.Nil(t, expiresAt(t, db, sc), "an unfinished key has no end of retention")

			// Unfinished for three TTLs: never reaped, never new.
			clock.Advance(3 * ttl)
			reaped, err := idempotency.Reap(ctx, db, clock.Now(), 100)
			require.NoError(t, err)
			require.Zero(t, reaped, "an unfinished key is never reaped")
			resumed, err := claim(t, db, s, sc, "fp", "owner-2", true)
			require.NoError(t, err)
			require.True(t, resumed.TakenOver, "the retry resumes the key; it is not new")
			require.Equal(t, "order_created", resumed.RecoveryPoint)

			resp := idempotency.JSONResponse(201, []byte(`{"id":"ord_1"}`), "/v1/orders/ord_1")
			finishedAt := clock.Now()
			if path == "transaction" {
				require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error { return s.Finish(ctx, tx, resumed, resp) }))
			} else {
				var b postgres.Batch
				require.NoError(t, s.QueueFinish(&b, resumed, resp))
				require.NoError(t, postgres.Send(ctx, db, &b))
			}
			require.True(t, finishedAt.Add(ttl).Equal(resp.ExpiresAt), "retention ends TTL after the final answer: %s", resp.ExpiresAt)
			stored := expiresAt(t, db, sc)
			require.NotNil(t, stored)
			require.True(t, finishedAt.Add(ttl).Equal(*stored), "stored %s", stored)

			// Just before the end of its retention: replayed, not reaped.
			clock.Advance(ttl - time.Second)
			reaped, err = idempotency.Reap(ctx, db, clock.Now(), 100)
			require.NoError(t, err)
			require.Zero(t, reaped, "a key is kept TTL after its final answer")
			replay, err := claim(t, db, s, sc, "fp", "owner-3", true)
			require.NoError(t, err)
			require.False(t, replay.New, "replayed, not run again")
			require.NotNil(t, replay.Response)
			require.Equal(t, `{"id":"ord_1"}`, string(replay.Response.Body))
			require.True(t, stored.Equal(replay.Response.ExpiresAt))

			// Past it: reaped, and the key is new.
			clock.Advance(2 * time.Second)
			reaped, err = idempotency.Reap(ctx, db, clock.Now(), 100)
			require.NoError(t, err)
			require.EqualValues(t, 1, reaped)
			again, err := claim(t, db, s, sc, "fp", "owner-4", true)
			require.NoError(t, err)
			require.True(t, again.New, "past its retention the key is new")
		})
	}
}

// expiresAt reads the expires_at of sc's key (nil: NULL).
func expiresAt(t testing.TB, db *gorm.DB, sc idempotency.Scope) *time.Time {
	t.Helper()
	var at *time.Time
	require.NoError(t, db.Raw(`SELECT expires_at FROM idempotency_keys WHERE tenant_id = ? AND route = ? AND key = ?`,
		sc.Tenant, sc.Route, sc.Key).Row().Scan(&at))
	return at
}

// TestRetentionMigrationMovesExistingKeys: migration 00018 moves the keys
// an older build wrote (expires_at fixed at the claim) to the rule: an
// unfinished key has no end of retention, even one whose old end has
// passed; a finished key that took more than a second keeps its TTL
// counted from when it finished, so a late-finished key past its old end
// replays again instead of being reaped and run as new (one that finished
// within a second is left as it was); a finished key must have an end.
// Down and up again both work.
func TestRetentionMigrationMovesExistingKeys(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	pgtest.MigrateDownTo(t, db, 17)

	t0 := time.Now().UTC().Truncate(time.Microsecond).Add(-3 * time.Hour)
	const ttl = time.Hour
	insert := func(key, point string, finishedAt *time.Time) {
		t.Helper()
		var status *int
		if finishedAt != nil {
			status = new(201)
		}
		require.NoError(t, db.Exec(`INSERT INTO idempotency_keys (tenant_id, route, key, fingerprint, recovery_point,
			  response_status, created_at, updated_at, finished_at, expires_at)
			VALUES ('acme', 'POST /v1/checkouts', ?, 'fp', ?, ?, ?, ?, ?, ?)`,
			key, point, status, t0, t0, finishedAt, t0.Add(ttl)).Error)
	}
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	insert("unfinished", "order_created", nil)
	insert("finished-fast", "finished", at(200*time.Millisecond)) // as most do: left as it was
	insert("finished-late", "finished", at(150*time.Minute))      // past its old end (t0+1h), not reaped yet

	require.NoError(t, postgres.Migrate(ctx, db, slog.New(slog.DiscardHandler)))
	stored := func(key string) *time.Time {
		return expiresAt(t, db, idempotency.Scope{Tenant: "acme", Route: "POST /v1/checkouts", Key: key})
	}
	require.Nil(t, stored("unfinished"))
	require.True(t, t0.Add(ttl).Equal(*stored("finished-fast")), "%s", stored("finished-fast"))
	require.True(t, t0.Add(150*time.Minute+ttl).Equal(*stored("finished-late")), "%s", stored("finished-late"))
	reaped, err := idempotency.Reap(ctx, db, time.Now(), 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, reaped, "only the key that finished fast is past its retention")
	require.NotNil(t, stored("finished-late"), "the late-finished key replays for its TTL after it finished")
	require.Nil(t, stored("unfinished"))

	err = db.Exec(`UPDATE idempotency_keys SET expires_at = NULL WHERE key = 'finished-late'`).Error
	require.ErrorContains(t, err, "idempotency_keys_finished_expires", "a finished key always has an end of retention")

	pgtest.MigrateDownTo(t, db, 17)
	require.NotNil(t, stored("unfinished"), "the older build needs an expires_at on every row")
	require.NoError(t, postgres.Migrate(ctx, db, slog.New(slog.DiscardHandler)))
	require.Nil(t, stored("unfinished"))
}
