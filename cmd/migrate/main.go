// Command migrate applies the embedded goose migrations to the database
// DATABASE_URL names and exits: 0 when the schema is current (a second run
// with nothing to apply exits 0 at once), 1 with the error otherwise. It is
// what a Kubernetes Job or a deploy step runs before api processes started
// with MIGRATE_ON_START=false serve on the new schema.
//
// The migrations run under a session advisory lock, so several runs at once
// (or a run and an api migrating at start) apply each migration once. A
// session lock lives on one server connection: DATABASE_URL must reach
// PostgreSQL directly, not through PgBouncer in transaction pooling, which
// hands each statement to whichever server connection is free and so takes
// and releases the lock on connections the migrations do not run on.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(1)
	}
}

// settings are migrate's environment variables.
type settings struct {
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable"`
	// Timeout bounds the whole run: reaching the server (retried), waiting
	// for the lock another run holds, and applying the migrations.
	Timeout  time.Duration `env:"MIGRATE_TIMEOUT" envDefault:"5m"`
	LogLevel slog.Level    `env:"LOG_LEVEL" envDefault:"info"`
}

func (s *settings) check() error {
	var errs []error
	if err := config.CheckDatabaseURL(s.DatabaseURL); err != nil {
		errs = append(errs, err)
	}
	if s.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("MIGRATE_TIMEOUT: must be positive, got %s", s.Timeout))
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	var s settings
	if err := config.Load(getenv, &s); err != nil {
		return err
	}
	if err := s.check(); err != nil {
		return err
	}
	logger := telemetry.NewLogger(stdout, s.LogLevel).With("process", "migrate")
	logger.Info("starting migrate", config.Masked(&s)...)

	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	// Two connections at most: goose holds the lock and runs every
	// migration on one; the pool must not be capped at 1 (goose refuses it).
	db, err := postgres.OpenRetrying(ctx, postgres.Config{URL: s.DatabaseURL, MaxConns: 2}, logger)
	if err != nil {
		return timeoutError(ctx, s.Timeout, fmt.Errorf("DATABASE_URL: %w", err))
	}
	defer postgres.Close(db)
	if err := postgres.Migrate(ctx, db, logger); err != nil {
		return timeoutError(ctx, s.Timeout, err)
	}
	logger.Info("migrations current")
	return nil
}

// timeoutError names MIGRATE_TIMEOUT when the run ran out of it, so the
// operator knows which setting cut it short.
func timeoutError(ctx context.Context, timeout time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("MIGRATE_TIMEOUT (%s) ran out: %w", timeout, err)
	}
	return err
}
