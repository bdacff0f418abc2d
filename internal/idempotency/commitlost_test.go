package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// errCommitLost is what a client sees when the connection drops after the
// server committed and before its answer arrived (a failover at commit).
var errCommitLost = errors.New("connection lost at commit (test)")

// commitLosingPool is the real database's pool, except that while lose is
// set each transaction's commit happens and then reports errCommitLost:
// the outcome a client cannot tell from a failed commit.
type commitLosingPool struct {
	*sql.DB
	lose atomic.Bool
}

// BeginTx makes gorm's Begin use lostCommitTx (gorm.ConnPoolBeginner).
func (p *commitLosingPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := p.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &lostCommitTx{Tx: tx, pool: p}, nil
}

type lostCommitTx struct {
	*sql.Tx
	pool *commitLosingPool
}

func (t *lostCommitTx) Commit() error {
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	if t.pool.lose.Load() {
		return errCommitLost
	}
	return nil
}

// losingCommits returns a handle on db's database whose commits lose
// their answer while the returned pool's lose is set.
func losingCommits(t testing.TB, db *gorm.DB) (*gorm.DB, *commitLosingPool) {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	pool := &commitLosingPool{DB: sqlDB}
	lossy := db.Session(&gorm.Session{NewDB: true})
	lossy.Statement.ConnPool = pool
	return lossy, pool
}

// TestExecuteReleasesAClaimWhoseCommitWasLost: the claim's transaction
// commits but its answer is lost (a failover at commit). The executor
// cannot know whether it holds the key, so it ends the lease by scope and
// owner at once: the client's retry resumes the key (one Start, one
// Resume, the key finished) instead of 409 idempotency_key_in_use for a
// whole IDEMPOTENCY_LEASE. The same holds for the completer's takeover
// (Executor.Complete). Before, only the fast path released in that case.
func TestExecuteReleasesAClaimWhoseCommitWasLost(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	lossy, pool := losingCommits(t, db)
	s := newStore() // a 30s lease: a retry within it finds the lease live unless released
	ctx := context.Background()

	t.Run("execute", func(t *testing.T) {
		f := &fakeCommand{store: s, db: db}
		sc := scope
		sc.Key = "commit-lost-execute"
		pool.lose.Store(true)
		_, _, err := (&idempotency.Executor{Store: s, DB: lossy}).Execute(ctx, sc, "fp", "owner-1", f)
		pool.lose.Store(false)
		require.ErrorIs(t, err, errCommitLost)
		require.Equal(t, []int{1, 0, 0}, []int{f.started, f.resumed, f.ran}, "the claim committed; nothing ran")

		resp, replayed, err := (&idempotency.Executor{Store: s, DB: db}).Execute(ctx, sc, "fp", "owner-2", f)
		require.NoError(t, err, "the retry is not told the key is in use")
		require.False(t, replayed)
		require.Equal(t, 201, resp.Status)
		require.Equal(t, []int{1, 1, 1}, []int{f.started, f.resumed, f.ran}, "resumed, not started again")
	})

	t.Run("complete", func(t *testing.T) {
		f := &fakeCommand{store: s, db: db}
		sc := scope
		sc.Key = "commit-lost-complete"
		c, err := claim(t, db, s, sc, "fp", "dead", true)
		require.NoError(t, err)
		require.NoError(t, s.Release(ctx, db, c)) // its owner died: the lease has ended
		f.ran = 0
		cmds := idempotency.Commands{sc.Route: func() idempotency.Command { return &resumeAt{fakeCommand: f, point: "order_created"} }}

		pool.lose.Store(true)
		_, err = (&idempotency.Executor{Store: s, DB: lossy}).Complete(ctx, c.ID, cmds)
		pool.lose.Store(false)
		require.ErrorIs(t, err, errCommitLost)

		resp, replayed, err := (&idempotency.Executor{Store: s, DB: db}).Execute(ctx, sc, "fp", "client", &resumeAt{fakeCommand: f, point: "order_created"})
		require.NoError(t, err, "the client's retry is not told the key is in use")
		require.False(t, replayed)
		require.Equal(t, 201, resp.Status)
	})
}

// resumeAt is fakeCommand for a key claimed by the claim helper, whose
// recovery point is point.
type resumeAt struct {
	*fakeCommand
	point string
}

func (r *resumeAt) Resume(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) error {
	r.mu.Lock()
	r.resumed++
	r.mu.Unlock()
	if c.RecoveryPoint != r.point {
		return errors.New("resumed at the wrong point")
	}
	return nil
}
