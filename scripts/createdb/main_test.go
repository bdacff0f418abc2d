package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestDropRemovesTheStacksDatabase (issue 36): `make dropdb` drops the
// database DATABASE_URL names, which `make run` created, and refuses while a
// process of the stack is still connected to it; both commands are no-ops
// when there is nothing to do.
func TestDropRemovesTheStacksDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(t, err)
	name := "createdb_test_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		_ = admin.Close(context.Background())
	})
	u, err := url.Parse(pgtest.AdminURL())
	require.NoError(t, err)
	u.Path = "/" + name
	dbURL := u.String()
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return dbURL
		}
		return ""
	}
	exists := func() bool {
		var ok bool
		require.NoError(t, admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&ok))
		return ok
	}
	cmd := func(args ...string) (string, error) {
		var out strings.Builder
		err := run(ctx, getenv, args, &out)
		return out.String(), err
	}

	out, err := cmd()
	require.NoError(t, err)
	require.Contains(t, out, "created database")
	require.True(t, exists())
	out, err = cmd()
	require.NoError(t, err)
	require.Empty(t, out, "already there")

	// A process of the stack still connected: the drop is refused.
	stack, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	_, err = cmd("-drop")
	require.ErrorContains(t, err, "stop `make run` first")
	require.True(t, exists())
	require.NoError(t, stack.Close(ctx))

	out, err = cmd("-drop")
	require.NoError(t, err)
	require.Contains(t, out, "dropped database")
	require.False(t, exists())
	out, err = cmd("-drop")
	require.NoError(t, err)
	require.Empty(t, out, "already gone")
}
