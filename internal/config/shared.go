package config

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Shared are the environment variables the dispatcher and the worker
// share (CONTRACT.md, "Configuration"). Each process embeds them in its own
// settings, beside the broker's (rabbitmq.Settings), and adds what only it
// needs.
type Shared struct {
	DatabaseURL string     `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable"`
	LogLevel    slog.Level `env:"LOG_LEVEL" envDefault:"info"`
	// ShutdownTimeout bounds the drain after SIGTERM.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"20s"`
}

// Check validates what parsing cannot; each error names its variable.
func (s *Shared) Check() []error {
	var errs []error
	if err := CheckDatabaseURL(s.DatabaseURL); err != nil {
		errs = append(errs, err)
	}
	if s.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("SHUTDOWN_TIMEOUT: must be positive"))
	}
	return errs
}

// CheckDatabaseURL returns an error naming DATABASE_URL when url is not a
// PostgreSQL connection string pgx can parse (URL or key=value form, libpq
// multi-host included). Every process checks it before it waits for the
// database (postgres.OpenRetrying), which would retry a malformed URL
// forever like an unreachable server.
func CheckDatabaseURL(url string) error {
	if _, err := pgx.ParseConfig(url); err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	return nil
}
