package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

func TestErrorClasses(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code}) }
	tests := []struct {
		name                string
		err                 error
		transient, dataExcp bool
	}{
		{"connection refused", errors.New("dial tcp: connection refused"), true, false},
		{"deadline", context.DeadlineExceeded, true, false},
		{"admin shutdown", pg("57P01"), true, false},
		{"serialization failure", pg("40001"), true, false},
		{"deadlock", pg("40P01"), true, false},
		{"connection failure", pg("08006"), true, false},
		{"NUL byte", pg("22021"), false, true},
		{"number out of range", pg("22003"), false, true},
		{"foreign key", pg("23503"), false, false},
		{"syntax", pg("42601"), false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.transient, postgres.IsTransient(tc.err))
			require.Equal(t, tc.dataExcp, postgres.IsDataException(tc.err))
		})
	}
	require.False(t, postgres.IsTransient(nil))
}

// TestWithTx: commit on nil, rollback on error and on panic.
func TestWithTx(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	insert := func(tx *gorm.DB, key string) error {
		return tx.Exec(`INSERT INTO inbox (consumer, message_id) VALUES ('t', ?)`, key).Error
	}
	count := func() int {
		var n int
		require.NoError(t, db.Raw(`SELECT count(*) FROM inbox`).Scan(&n).Error)
		return n
	}
	require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error { return insert(tx, "a") }))
	boom := errors.New("boom")
	require.ErrorIs(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
		require.NoError(t, insert(tx, "b"))
		return boom
	}), boom)
	require.Panics(t, func() {
		_ = postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
			require.NoError(t, insert(tx, "c"))
			panic("boom")
		})
	})
	require.Equal(t, 1, count(), "only the committed row")
	// A cancelled context rolls back and leaves the pool usable.
	cctx, cancel := context.WithCancel(ctx)
	err := postgres.WithTx(cctx, db, func(tx *gorm.DB) error {
		require.NoError(t, insert(tx, "d"))
		cancel()
		return insert(tx, "e")
	})
	require.Error(t, err)
	require.Equal(t, 1, count())
}

// TestTextArray: the literal round-trips through PostgreSQL element for
// element, quotes, backslashes, commas, braces and empty strings included.
func TestTextArray(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	in := []string{"ord_1", `a"b`, `c\d`, "e,f", "{g}", "", "NULL"}
	var out []string
	rows, err := db.Raw(`SELECT unnest(?::text[])`, postgres.TextArray(in)).Rows()
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, in, out)
}

// TestIntArray: the literal round-trips through PostgreSQL, negatives,
// zero and the int64 extremes included, and an empty slice is {}.
func TestIntArray(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	for _, in := range [][]int64{{1, -2, 0, math.MaxInt64, math.MinInt64}, {}} {
		var out []int64
		require.NoError(t, db.Raw(`SELECT unnest(?::bigint[])`, postgres.IntArray(in)).Scan(&out).Error)
		if len(in) == 0 {
			require.Empty(t, out)
			continue
		}
		require.Equal(t, in, out)
	}
}

// TestMigrateReplacesAnIndexAFailedConcurrentBuildLeft: migration 00007
// builds its index CONCURRENTLY, which on failure leaves an INVALID index
// behind and the migration unrecorded. The next Migrate runs it again and
// ends with a valid index, one of that name.
func TestMigrateReplacesAnIndexAFailedConcurrentBuildLeft(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	valid := func() []bool {
		var v []bool
		require.NoError(t, db.Raw(`SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			WHERE c.relname = 'payment_attempts_recreated'`).Scan(&v).Error)
		return v
	}
	require.Equal(t, []bool{true}, valid())

	// What a build interrupted after its catalog entry looks like, 00007
	// being the last migration then: the later ones undone, the index
	// marked invalid, and goose's record of 00007 missing.
	pgtest.MigrateDownTo(t, db, 7)
	require.NoError(t, db.Exec(`UPDATE pg_index SET indisvalid = false
		WHERE indexrelid = 'payment_attempts_recreated'::regclass`).Error)
	require.NoError(t, db.Exec(`DELETE FROM goose_db_version WHERE version_id = 7`).Error)
	require.Equal(t, []bool{false}, valid())

	require.NoError(t, postgres.Migrate(ctx, db, slog.New(slog.DiscardHandler)))
	require.Equal(t, []bool{true}, valid(), "one index of that name, valid")
	var applied int
	require.NoError(t, db.Raw(`SELECT count(*) FROM goose_db_version WHERE version_id = 7 AND is_applied`).Scan(&applied).Error)
	require.Equal(t, 1, applied)
}

// TestMigrationsCopyTheEmailsAmounts: migrations 00011 and 00012 fill the
// amounts an email says into the notifications made before them (the
// refund's amount from refunds, the order's total and currency from
// orders), so that the sender, which no longer reads those tables, does
// not send 0.00 for them; and both go down and up again.
func TestMigrationsCopyTheEmailsAmounts(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	pgtest.MigrateDownTo(t, db, 10)

	// Rows as a worker of before 00011 wrote them.
	require.NoError(t, db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES ('ord_m', 'acme', 'partially_refunded', 'a@example.com', 'eur', 4200, 'pm_card_visa', now(), now())`).Error)
	require.NoError(t, db.Exec(`INSERT INTO refunds (id, tenant_id, order_id, amount, currency, status, payment_intent_id, created_at, updated_at)
		VALUES ('re_m', 'acme', 'ord_m', 1500, 'eur', 'succeeded', 'pi_m', now(), now())`).Error)
	require.NoError(t, db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind)
		VALUES ('ntf_paid', 'ord_m', 'acme', 'email', 'a@example.com', 'pending', 'order_paid')`).Error)
	require.NoError(t, db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, refund_id)
		VALUES ('ntf_refund', 'ord_m', 'acme', 'email', 'a@example.com', 'pending', 'order_refunded', 're_m')`).Error)

	require.NoError(t, postgres.Migrate(ctx, db, slog.New(slog.DiscardHandler)))
	type amounts struct {
		ID           string
		OrderAmount  *int64
		Currency     *string
		RefundAmount *int64
	}
	var got []amounts
	require.NoError(t, db.Raw(`SELECT id, order_amount, currency, refund_amount FROM notifications ORDER BY id`).Scan(&got).Error)
	i64 := func(n int64) *int64 { return &n }
	eur := "eur"
	require.Equal(t, []amounts{
		{ID: "ntf_paid", OrderAmount: i64(4200), Currency: &eur},
		{ID: "ntf_refund", OrderAmount: i64(4200), Currency: &eur, RefundAmount: i64(1500)},
	}, got)

	pgtest.MigrateDownTo(t, db, 10)
	require.NoError(t, postgres.Migrate(ctx, db, slog.New(slog.DiscardHandler)))
}

// sqlRecorder is a GORM logger that keeps the SQL text each Trace is given.
type sqlRecorder struct {
	gormlogger.Interface
	sql []string
}

func (r *sqlRecorder) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	s, _ := fc()
	r.sql = append(r.sql, s)
}

// GORM's Scan hands its logger the statement as the dialector explains it,
// whatever the logger (finisher_api.go); Open's dialector leaves the
// arguments out, so that no statement's data is formatted for nothing (or
// logged, should a logger ever be installed).
func TestScanDoesNotWriteTheArgumentsIntoTheSQL(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	rec := &sqlRecorder{Interface: gormlogger.Discard}
	var got string
	require.NoError(t, db.Session(&gorm.Session{Logger: rec}).
		Raw(`SELECT ?::text || ?::text`, "buyer@", "example.com").Scan(&got).Error)
	require.Equal(t, "buyer@example.com", got)
	require.Equal(t, []string{`SELECT $1::text || $2::text`}, rec.sql)
}
