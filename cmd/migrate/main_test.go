package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/testenv"
	"github.com/onceonly/checkout/migrations"
)

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// migrationCount is the number of embedded migrations.
func migrationCount(t *testing.T) int {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return len(files)
}

// applied returns how many times each migration version is recorded as
// applied, and whether the schema's tables exist.
func applied(t *testing.T, dbURL string) (map[int64]int, bool) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var tables bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('public.orders') IS NOT NULL AND to_regclass('public.outbox') IS NOT NULL`).Scan(&tables))
	rows, err := conn.Query(ctx, `SELECT version_id FROM goose_db_version WHERE is_applied AND version_id > 0`)
	require.NoError(t, err)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	counts := map[int64]int{}
	for _, v := range versions {
		counts[v]++
	}
	return counts, tables
}

// TestMigrateAppliesAndExits: on an empty database migrate applies every
// migration once and returns (exit 0); a second run finds nothing to apply
// and returns at once.
func TestMigrateAppliesAndExits(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyDB(t)
	out := &testenv.Output{}
	require.NoError(t, run(context.Background(), getenv(map[string]string{"DATABASE_URL": dbURL}), out))
	counts, tables := applied(t, dbURL)
	require.True(t, tables, "the schema exists")
	require.Len(t, counts, migrationCount(t))
	for v, n := range counts {
		require.Equal(t, 1, n, "version %d", v)
	}
	require.Equal(t, migrationCount(t), strings.Count(out.String(), `"msg":"migration applied"`))

	again := &testenv.Output{}
	start := time.Now()
	require.NoError(t, run(context.Background(), getenv(map[string]string{"DATABASE_URL": dbURL}), again))
	require.Less(t, time.Since(start), 5*time.Second)
	require.NotContains(t, again.String(), "migration applied")
	require.Contains(t, again.String(), "migrations current")
}

// TestConcurrentRunsApplyEachMigrationOnce: runs started together (a Job
// retried while the first attempt still runs, or an api migrating at start)
// wait for the lock and apply each migration once; all exit 0.
func TestConcurrentRunsApplyEachMigrationOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyDB(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = run(context.Background(), getenv(map[string]string{"DATABASE_URL": dbURL}), io.Discard)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "run %d", i)
	}
	counts, _ := applied(t, dbURL)
	require.Len(t, counts, migrationCount(t))
	for v, n := range counts {
		require.Equal(t, 1, n, "version %d applied once", v)
	}
}

// TestMigrateTimeoutBoundsTheWaitForTheLock: while another session holds
// the migration lock, migrate gives up after MIGRATE_TIMEOUT with an error
// naming it, and applies nothing.
func TestMigrateTimeoutBoundsTheWaitForTheLock(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyDB(t)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close(ctx) })
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(postgres.MigrationLockID))
	require.NoError(t, err)

	start := time.Now()
	err = run(ctx, getenv(map[string]string{"DATABASE_URL": dbURL, "MIGRATE_TIMEOUT": "2s"}), io.Discard)
	require.ErrorContains(t, err, "MIGRATE_TIMEOUT (2s) ran out")
	require.Less(t, time.Since(start), 6*time.Second)
	var exists bool
	require.NoError(t, holder.QueryRow(ctx, `SELECT to_regclass('public.orders') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "nothing applied without the lock")

	// Once the lock is released, a run goes through.
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(postgres.MigrationLockID))
	require.NoError(t, err)
	require.NoError(t, run(ctx, getenv(map[string]string{"DATABASE_URL": dbURL, "MIGRATE_TIMEOUT": "30s"}), io.Discard))
}

// TestMigrateTimeoutBoundsTheWaitForTheServer: a server that does not answer
// is retried until MIGRATE_TIMEOUT, then the run fails naming it.
func TestMigrateTimeoutBoundsTheWaitForTheServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // a port nothing listens on
	start := time.Now()
	err = run(context.Background(), getenv(map[string]string{
		"DATABASE_URL":    fmt.Sprintf("postgres://postgres@%s/checkout?sslmode=disable&connect_timeout=1", addr),
		"MIGRATE_TIMEOUT": "2s",
	}), io.Discard)
	require.ErrorContains(t, err, "MIGRATE_TIMEOUT (2s) ran out")
	require.Less(t, time.Since(start), 6*time.Second)
}

func TestBadValueStopsStartNamingTheVariable(t *testing.T) {
	t.Parallel()
	for name, env := range map[string]map[string]string{
		"DATABASE_URL":    {"DATABASE_URL": "postgres://x:y@:badport"},
		"MIGRATE_TIMEOUT": {"MIGRATE_TIMEOUT": "0s"},
		"LOG_LEVEL":       {"LOG_LEVEL": "loud"},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), getenv(env), io.Discard)
			require.ErrorContains(t, err, name)
		})
	}
}

// TestMigrateFollowsAMultiHostURL: DATABASE_URL may name several hosts
// (libpq multi-host); migrate connects to the first that takes writes, here
// past one that does not answer.
func TestMigrateFollowsAMultiHostURL(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmptyDB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.Host = dead + "," + u.Host
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	require.NoError(t, run(context.Background(), getenv(map[string]string{"DATABASE_URL": u.String(), "MIGRATE_TIMEOUT": "30s"}), io.Discard))
	counts, tables := applied(t, dbURL)
	require.True(t, tables)
	require.Len(t, counts, migrationCount(t))
}
