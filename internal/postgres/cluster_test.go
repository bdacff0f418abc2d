package postgres_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestMultiHostURLFollowsPromotion: with a DATABASE_URL naming the primary
// and the standby and target_session_attrs=read-write, the pool writes to
// the primary only (the standby, read-only, is skipped though it answers);
// once the primary is killed and the standby promoted, the same pool
// reconnects to the new primary by itself, where every commit acknowledged
// before the kill is (the standby is synchronous).
func TestMultiHostURLFollowsPromotion(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	db, err := postgres.Open(ctx, postgres.Config{URL: c.URL("postgres"), MaxConns: 4})
	require.NoError(t, err)
	t.Cleanup(func() { postgres.Close(db) })
	require.NoError(t, postgres.Migrate(ctx, db, slog.New(slog.NewTextHandler(io.Discard, nil))))
	var port int
	require.NoError(t, db.WithContext(ctx).Raw(`SELECT inet_server_port()`).Scan(&port).Error)
	require.Equal(t, c.Primary.Port, port, "connected to the primary, the first host")

	require.NoError(t, db.WithContext(ctx).Exec(`CREATE TABLE acked (n int PRIMARY KEY)`).Error)
	for n := range 50 {
		require.NoError(t, db.WithContext(ctx).Exec(`INSERT INTO acked VALUES (?)`, n).Error)
	}

	c.Primary.Kill()
	promotion, err := c.Promote()
	require.NoError(t, err)
	t.Logf("promotion took %s", promotion)

	// The pool's connections to the dead primary fail; new ones go to the
	// standby, now read-write.
	require.Eventually(t, func() bool {
		return db.WithContext(ctx).Exec(`INSERT INTO acked VALUES (50)`).Error == nil
	}, 30*time.Second, 100*time.Millisecond, "a write on the new primary through the same URL")
	require.NoError(t, db.WithContext(ctx).Raw(`SELECT inet_server_port()`).Scan(&port).Error)
	require.Equal(t, c.Standby.Port, port)
	var count int
	require.NoError(t, db.WithContext(ctx).Raw(`SELECT count(*) FROM acked`).Scan(&count).Error)
	require.Equal(t, 51, count, "every acknowledged commit survived the failover")
}

// TestMultiHostURLSkipsAStandbyListedFirst: with the standby named first,
// target_session_attrs=read-write makes the pool pass over it (it answers,
// read-only) and write to the primary; a single-host URL naming the standby
// connects but cannot write.
func TestMultiHostURLSkipsAStandbyListedFirst(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.ClusterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := "postgres://postgres@" + c.Standby.Addr() + "," + c.Primary.Addr() + "/postgres?sslmode=disable&target_session_attrs=read-write"
	db, err := postgres.Open(ctx, postgres.Config{URL: url, MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { postgres.Close(db) })
	require.NoError(t, db.WithContext(ctx).Exec(`CREATE TABLE w (n int)`).Error)

	only, err := postgres.Open(ctx, postgres.Config{URL: c.Standby.URL("postgres"), MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { postgres.Close(only) })
	err = only.WithContext(ctx).Exec(`CREATE TABLE w2 (n int)`).Error
	require.ErrorContains(t, err, "read-only transaction")
}
