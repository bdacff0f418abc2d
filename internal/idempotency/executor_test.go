package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// fakeCommand records what the executor asked of it. Start advances the
// key to "step_1" (or finishes it with final); Run fails with runErr or
// finishes the key with 201.
type fakeCommand struct {
	store  *idempotency.Store
	db     *gorm.DB
	final  *idempotency.Response
	runErr error

	mu                    sync.Mutex
	started, resumed, ran int
}

func (f *fakeCommand) Start(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (*idempotency.Response, error) {
	f.mu.Lock()
	f.started++
	f.mu.Unlock()
	if f.final != nil {
		return f.final, f.store.Finish(ctx, tx, c, f.final)
	}
	return nil, f.store.Advance(ctx, tx, c, "step_1", "ord_1")
}

func (f *fakeCommand) Resume(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) error {
	f.mu.Lock()
	f.resumed++
	f.mu.Unlock()
	if c.RecoveryPoint != "step_1" || c.OrderID != "ord_1" {
		return errors.New("resumed at the wrong point")
	}
	return nil
}

func (f *fakeCommand) Run(ctx context.Context, c *idempotency.Claim) (*idempotency.Response, error) {
	f.mu.Lock()
	f.ran++
	err := f.runErr
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	resp := idempotency.JSONResponse(201, []byte(`{"id":"ord_1"}`), "")
	return resp, postgres.WithTx(ctx, f.db, func(tx *gorm.DB) error {
		if err := f.store.Fence(ctx, tx, c); err != nil {
			return err
		}
		return f.store.Finish(ctx, tx, c, resp)
	})
}

// TestExecutor walks one key through the executor's rules: run, 409 while
// leased, 422 for another body, release after a failed run, resume, replay.
func TestExecutor(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	s := newStore()
	e := &idempotency.Executor{Store: s, DB: db}
	ctx := context.Background()
	f := &fakeCommand{store: s, db: db, runErr: errors.New("stripe unanswered")}

	_, _, err := e.Execute(ctx, scope, "fp", "owner-1", f)
	require.ErrorContains(t, err, "stripe unanswered")
	require.Equal(t, 1, f.started)

	// The failed run released the lease: the retry resumes at once.
	f.runErr = nil
	_, _, err = e.Execute(ctx, scope, "other-fp", "owner-2", f)
	require.ErrorIs(t, err, idempotency.ErrKeyReused)
	resp, replayed, err := e.Execute(ctx, scope, "fp", "owner-2", f)
	require.NoError(t, err)
	require.False(t, replayed)
	require.Equal(t, 201, resp.Status)
	require.Equal(t, []int{1, 1, 2}, []int{f.started, f.resumed, f.ran})

	resp, replayed, err = e.Execute(ctx, scope, "fp", "owner-3", f)
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, `{"id":"ord_1"}`, string(resp.Body))
	require.Equal(t, []int{1, 1, 2}, []int{f.started, f.resumed, f.ran}, "a replay runs nothing")

	// A key leased by a live owner is 409, and nothing runs.
	other := scope
	other.Key = "key-2"
	require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
		c, err := s.Claim(ctx, tx, other, "fp", "alive")
		if err != nil {
			return err
		}
		return s.Advance(ctx, tx, c, "step_1", "ord_1")
	}))
	_, _, err = e.Execute(ctx, other, "fp", "owner-4", f)
	require.ErrorIs(t, err, idempotency.ErrKeyInUse)
	require.Equal(t, []int{1, 1, 2}, []int{f.started, f.resumed, f.ran})

	// A Start that finishes the key answers with its response.
	third := scope
	third.Key = "key-3"
	g := &fakeCommand{store: s, db: db, final: idempotency.JSONResponse(409, []byte(`{}`), "")}
	resp, replayed, err = e.Execute(ctx, third, "fp", "owner-5", g)
	require.NoError(t, err)
	require.False(t, replayed)
	require.Equal(t, 409, resp.Status)
	require.Zero(t, g.ran)
}

// TestExecutorComplete: the completer's path resumes an expired key only
// for a route it has a command for, and a lost lease is not released.
func TestExecutorComplete(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s := &idempotency.Store{Lease: 30 * time.Second, TTL: 24 * time.Hour, Now: clock}
	e := &idempotency.Executor{Store: s, DB: db}
	ctx := context.Background()

	var keyID int64
	require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
		c, err := s.Claim(ctx, tx, scope, "fp", "dead")
		if err != nil {
			return err
		}
		keyID = c.ID
		return s.Advance(ctx, tx, c, "step_1", "ord_1")
	}))
	f := &fakeCommand{store: s, db: db}
	cmds := idempotency.Commands{scope.Route: func() idempotency.Command { return f }}

	done, err := e.Complete(ctx, keyID, cmds)
	require.NoError(t, err)
	require.False(t, done, "the lease is live")

	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	done, err = e.Complete(ctx, keyID, idempotency.Commands{"POST /v1/other": cmds[scope.Route]})
	require.NoError(t, err)
	require.False(t, done, "another route's key is not taken over")
	require.Zero(t, f.resumed)

	done, err = e.Complete(ctx, keyID, cmds)
	require.NoError(t, err)
	require.True(t, done)
	require.Equal(t, []int{0, 1, 1}, []int{f.started, f.resumed, f.ran})

	_, replayed, err := e.Execute(ctx, scope, "fp", "client", f)
	require.NoError(t, err)
	require.True(t, replayed, "the completer finished the key")
}

// TestFence: the fence holds for the lease's owner only, and Store.Fence
// refuses a stale owner with ErrLeaseLost.
func TestFence(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	s := newStore()
	ctx := context.Background()
	c, err := claim(t, db, s, scope, "fp", "owner-1", true)
	require.NoError(t, err)

	// Queued first in a batch, it lets the batch's write through only
	// while the fence holds.
	holds := func(f idempotency.Fence) bool {
		var b postgres.Batch
		f.Queue(&b)
		b.Queue(`INSERT INTO inbox (consumer, message_id) VALUES ('fence', ?)`, []any{ids.New("m")}, nil)
		before := countFenced(t, db)
		err := postgres.Send(ctx, db, &b)
		after := countFenced(t, db)
		if err != nil {
			require.True(t, postgres.IsGuard(err, idempotency.GuardLeaseLost), "%v", err)
			require.Equal(t, before, after, "nothing written")
			return false
		}
		require.Equal(t, before+1, after)
		return true
	}
	require.True(t, holds(c.Fence()))
	require.False(t, holds(idempotency.Fence{Scope: c.Scope, Owner: "stale"}))
	require.True(t, holds(idempotency.Fence{}), "the zero Fence fences nothing")
	require.Equal(t, idempotency.Fence{}, (*idempotency.Claim)(nil).Fence())

	require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error { return s.Fence(ctx, tx, c) }))
	err = postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
		return s.Fence(ctx, tx, &idempotency.Claim{ID: c.ID, Scope: c.Scope, Owner: "stale"})
	})
	require.ErrorIs(t, err, idempotency.ErrLeaseLost)
}

// TestReleaseByScope: a claim whose commit was lost is known only by its
// scope and owner; Release of such a Claim ends that owner's lease, so a
// retry takes the key over at once, and leaves another owner's alone.
func TestReleaseByScope(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	s := newStore()
	ctx := context.Background()
	c, err := claim(t, db, s, scope, "fp", "owner-1", true)
	require.NoError(t, err)
	leaseLive := func() bool {
		var live bool
		require.NoError(t, db.Raw(`SELECT lease_expires_at > now() FROM idempotency_keys WHERE id = ?`, c.ID).Row().Scan(&live))
		return live
	}
	require.True(t, leaseLive())

	require.NoError(t, s.Release(ctx, db, &idempotency.Claim{Scope: scope, Owner: "owner-2"}))
	require.True(t, leaseLive(), "another owner's release changes nothing")
	other := scope
	other.Key += "-other"
	require.NoError(t, s.Release(ctx, db, &idempotency.Claim{Scope: other, Owner: "owner-1"}))
	require.True(t, leaseLive(), "another scope's release changes nothing")

	require.NoError(t, s.Release(ctx, db, &idempotency.Claim{Scope: scope, Owner: "owner-1"}))
	require.False(t, leaseLive(), "the owner's release by scope ends the lease")
	again, err := claim(t, db, s, scope, "fp", "owner-3", true)
	require.NoError(t, err)
	require.True(t, again.TakenOver, "the retry takes the key over at once")
}

// TestAnExtensionAfterTheReleaseDoesNotReviveTheLease: the lease keeper
// (KeepLease, the gateway's) ticks on its own goroutine, so its Extend can
// reach the row just after the run failed and Release ended the lease.
// Release must win whatever the order: the retry takes the key over at
// once. Before, Release only moved lease_expires_at to now, the late
// Extend (same owner) moved it a whole lease ahead, and the client's
// retry got 409 idempotency_key_in_use for IDEMPOTENCY_LEASE (seen as a
// 502 followed by a 409 when the keeper's tick met the request's end).
func TestAnExtensionAfterTheReleaseDoesNotReviveTheLease(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	s := newStore()
	ctx := context.Background()
	for _, byScope := range []bool{false, true} {
		sc := scope
		sc.Key += fmt.Sprintf("-by-scope-%v", byScope)
		c, err := claim(t, db, s, sc, "fp", "owner-1", true)
		require.NoError(t, err)
		released := &idempotency.Claim{ID: c.ID, Scope: sc, Owner: "owner-1"}
		if byScope {
			released.ID = 0
		}
		require.NoError(t, s.Release(ctx, db, released))
		extended, err := s.Extend(ctx, db, sc, "owner-1")
		require.NoError(t, err)
		require.False(t, extended, "a released lease is not extended")
		again, err := claim(t, db, s, sc, "fp", "owner-2", true)
		require.NoError(t, err, "the retry is not told the key is in use")
		require.True(t, again.TakenOver)
		fenced := postgres.WithTx(ctx, db, func(tx *gorm.DB) error { return s.Fence(ctx, tx, c) })
		require.ErrorIs(t, fenced, idempotency.ErrLeaseLost, "the released owner writes nothing more")
	}
}

// countFenced counts the rows TestFence's batches wrote.
func countFenced(t *testing.T, db *gorm.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.Raw(`SELECT count(*) FROM inbox WHERE consumer = 'fence'`).Scan(&n).Error)
	return n
}
