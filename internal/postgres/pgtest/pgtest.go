// Package pgtest gives each test its own freshly migrated PostgreSQL
// database on the shared server, dropped when the test ends.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/migrations"
)

// AdminURL is the server the test databases are created on:
// $TEST_DATABASE_URL, or the machine's local trust-auth PostgreSQL.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// Options tune NewDB.
type Options struct {
	// MaxConns caps the pool (0: postgres.Open's default).
	MaxConns int
}

// NewDB creates a database named checkout_test_<random>, applies the
// migrations, and returns an open handle and the database's URL (for
// processes a test starts). The database is dropped in t.Cleanup.
func NewDB(t testing.TB, opts ...Options) (*gorm.DB, string) {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dbURL := NewEmptyDB(t)
	db, err := postgres.Open(ctx, postgres.Config{URL: dbURL, MaxConns: o.MaxConns})
	if err != nil {
		t.Fatalf("pgtest: open: %v", err)
	}
	t.Cleanup(func() { postgres.Close(db) })
	if err := postgres.Migrate(ctx, db, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("pgtest: migrate: %v", err)
	}
	return db, dbURL
}

// MigrateDownTo rolls db's schema back with the embedded migrations'
// Down sections until version is the last one applied, for a test that
// writes rows as an older build did and then migrates up again
// (postgres.Migrate) to check a migration's backfill, or its way down and
// up. It fails the test on any error.
func MigrateDownTo(t testing.TB, db *gorm.DB, version int64) {
	t.Helper()
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatalf("pgtest: migrate down: %v", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS)
	if err != nil {
		t.Fatalf("pgtest: migrate down: %v", err)
	}
	if _, err := provider.DownTo(context.Background(), version); err != nil {
		t.Fatalf("pgtest: migrate down to %d: %v", version, err)
	}
}

// NewEmptyDB creates a database named checkout_test_<random> without
// applying the migrations and returns its URL; it is dropped in t.Cleanup.
func NewEmptyDB(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := "checkout_test_" + randomHex(6)
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatalf("pgtest: connect %s: %v (is PostgreSQL running?)", AdminURL(), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() { dropDB(t, name) })
	return withDatabase(t, AdminURL(), name)
}

func dropDB(t testing.TB, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Logf("pgtest: drop %s: %v", name, err)
		return
	}
	defer admin.Close(ctx)
	// FORCE ends connections a killed child process may have left behind.
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		t.Logf("pgtest: drop %s: %v", name, err)
	}
}

func withDatabase(t testing.TB, raw, name string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", raw, err)
	}
	u.Path = "/" + name
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("pgtest: random: %v", err))
	}
	return hex.EncodeToString(b)
}
