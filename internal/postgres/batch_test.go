package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestBatchIsOneTransaction: a batch's statements see each other's writes
// and run in one transaction; a failed guard, or any error, writes nothing
// of it, the statements before the failure included.
func TestBatchIsOneTransaction(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	count := func() int {
		var n int
		require.NoError(t, db.Raw(`SELECT count(*) FROM inbox WHERE consumer = 'batch'`).Scan(&n).Error)
		return n
	}
	insert := `INSERT INTO inbox (consumer, message_id) VALUES ('batch', ?) RETURNING message_id`

	var b postgres.Batch
	var tx1, tx2 int64
	var seen int
	b.Queue(insert, []any{"m1"}, nil)
	b.Queue(`SELECT txid_current()`, nil, func(r pgx.Row) error { return r.Scan(&tx1) })
	b.QueueGuarded("m1 written", `SELECT message_id FROM inbox WHERE consumer = 'batch' AND message_id = ?`, []any{"m1"}, nil)
	b.Queue(insert, []any{"m2"}, nil)
	b.Queue(`SELECT count(*) FROM inbox WHERE consumer = 'batch'`, nil, func(r pgx.Row) error { return r.Scan(&seen) })
	b.Queue(`SELECT txid_current()`, nil, func(r pgx.Row) error { return r.Scan(&tx2) })
	require.NoError(t, postgres.Send(ctx, db, &b))
	require.Equal(t, 2, count())
	require.Equal(t, 2, seen, "a statement sees the batch's earlier writes")
	require.Equal(t, tx1, tx2, "one transaction")

	// A guard that finds nothing: the write before it is rolled back, the
	// one after it never runs, and the error names the guard.
	var failed postgres.Batch
	var ran bool
	failed.Queue(insert, []any{"m3"}, nil)
	failed.QueueGuarded("m9 written", `SELECT message_id FROM inbox WHERE consumer = 'batch' AND message_id = ?`, []any{"m9"}, nil)
	failed.Queue(insert, []any{"m4"}, func(pgx.Row) error { ran = true; return nil })
	err := postgres.Send(ctx, db, &failed)
	require.True(t, postgres.IsGuard(err, "m9 written"), "%v", err)
	require.True(t, postgres.IsGuard(err, ""))
	require.False(t, postgres.IsGuard(err, "m1 written"))
	require.False(t, ran)
	require.Equal(t, 2, count(), "nothing of a failed batch is written")

	// A guard over a write: it passes with the write's row, and fails when
	// the write matched nothing.
	var guardedWrite postgres.Batch
	var got string
	guardedWrite.QueueGuarded("m1 updated", `UPDATE inbox SET message_id = 'm1b' WHERE consumer = 'batch' AND message_id = ? RETURNING message_id`,
		[]any{"m1"}, func(r pgx.Row) error { return r.Scan(&got) })
	require.NoError(t, postgres.Send(ctx, db, &guardedWrite))
	require.Equal(t, "m1b", got)
	var again postgres.Batch
	again.Queue(insert, []any{"m5"}, nil)
	again.QueueGuarded("m1 updated", `UPDATE inbox SET message_id = 'm1c' WHERE consumer = 'batch' AND message_id = ? RETURNING message_id`, []any{"m1"}, nil)
	require.True(t, postgres.IsGuard(postgres.Send(ctx, db, &again), "m1 updated"))
	require.Equal(t, 2, count())

	// Any other error aborts it the same way (a unique violation here).
	var dup postgres.Batch
	dup.Queue(insert, []any{"m6"}, nil)
	dup.Queue(insert, []any{"m2"}, nil)
	err = postgres.Send(ctx, db, &dup)
	require.Error(t, err)
	require.False(t, postgres.IsGuard(err, ""))
	require.Equal(t, 2, count())
}

// TestBatchCommitWithoutFlush: synchronous_commit is off inside that
// batch only, and the connection's setting is back after it.
func TestBatchCommitWithoutFlush(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1) // the same connection for every batch

	show := func(async bool) string {
		var b postgres.Batch
		var v string
		if async {
			b.CommitWithoutFlush()
		}
		b.Queue(`SELECT current_setting('synchronous_commit')`, nil, func(r pgx.Row) error { return r.Scan(&v) })
		require.NoError(t, postgres.Send(ctx, db, &b))
		return v
	}
	require.Equal(t, "on", show(false))
	require.Equal(t, "off", show(true))
	require.Equal(t, "on", show(false), "local to its transaction")
}

// TestBatchPlaceholders: ? becomes $n outside quotes only.
func TestBatchPlaceholders(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	var b postgres.Batch
	var a, lit, name string
	b.Queue(`SELECT ?::text, '?' AS "x?", ?::text`, []any{"one", "two"}, func(r pgx.Row) error { return r.Scan(&a, &lit, &name) })
	require.NoError(t, postgres.Send(context.Background(), db, &b))
	require.Equal(t, []string{"one", "?", "two"}, []string{a, lit, name})
}

// TestBatchAfterCommit: the functions run after a commit, never after a
// failure, even one after the statement that added them.
func TestBatchAfterCommit(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	var calls []string
	var ok postgres.Batch
	ok.Queue(`SELECT 1`, nil, nil)
	ok.AfterCommit(func() { calls = append(calls, "first") })
	ok.AfterCommit(func() { calls = append(calls, "second") })
	require.NoError(t, postgres.Send(ctx, db, &ok))
	require.Equal(t, []string{"first", "second"}, calls)

	var failed postgres.Batch
	failed.Queue(`SELECT 1`, nil, nil)
	failed.AfterCommit(func() { calls = append(calls, "after a failure") })
	failed.QueueGuarded("never", `SELECT 1 WHERE false`, nil, nil)
	require.True(t, postgres.IsGuard(postgres.Send(ctx, db, &failed), "never"))
	require.Equal(t, []string{"first", "second"}, calls)
}

// TestBatchInTransaction: sent on a transaction, a batch's statements run
// in it (the caller's rollback undoes them), its scans read their rows,
// and a guard fails the same way.
func TestBatchInTransaction(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	count := func() int {
		var n int
		require.NoError(t, db.Raw(`SELECT count(*) FROM inbox WHERE consumer = 'tx'`).Scan(&n).Error)
		return n
	}
	insert := `INSERT INTO inbox (consumer, message_id) VALUES ('tx', ?) RETURNING message_id`
	var got string
	var done bool
	require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
		var b postgres.Batch
		b.Queue(insert, []any{"t1"}, func(r pgx.Row) error { return r.Scan(&got) })
		b.QueueGuarded("t1 written", `SELECT message_id FROM inbox WHERE consumer = 'tx' AND message_id = ?`, []any{"t1"}, nil)
		b.AfterCommit(func() { done = true })
		return postgres.Send(ctx, tx, &b)
	}))
	require.Equal(t, "t1", got)
	require.True(t, done)
	require.Equal(t, 1, count())

	err := postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
		var b postgres.Batch
		b.Queue(insert, []any{"t2"}, nil)
		b.QueueGuarded("t9 written", `SELECT message_id FROM inbox WHERE consumer = 'tx' AND message_id = ?`, []any{"t9"}, nil)
		return postgres.Send(ctx, tx, &b)
	})
	require.True(t, postgres.IsGuard(err, "t9 written"), "%v", err)
	require.Equal(t, 1, count(), "the caller's rollback undid it")

	var none postgres.Batch
	var scanErr error
	none.Queue(`SELECT 1 WHERE false`, nil, func(r pgx.Row) error { var n int; scanErr = r.Scan(&n); return nil })
	require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error { return postgres.Send(ctx, tx, &none) }))
	require.ErrorIs(t, scanErr, pgx.ErrNoRows)
}
