package config

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/checkout/internal/rabbitmq"
)

// Shared are the environment variables the dispatcher and the worker
// share (CONTRACT.md, "Configuration"). Each process embeds them in its own
// settings and adds what only it needs.
type Shared struct {
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable"`
	// AMQPURL is one AMQP URI or a comma-separated list of a cluster's
	// nodes (rabbitmq.ParseURLs).
	AMQPURL  string     `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/"`
	LogLevel slog.Level `env:"LOG_LEVEL" envDefault:"info"`
	// Exchange and NotifyQueue name the topology; the dead-letter queue is
	// NotifyQueue + ".dlq". Tests set them to names of their own.
	Exchange    string `env:"AMQP_EXCHANGE" envDefault:"checkout.events"`
	NotifyQueue string `env:"NOTIFY_QUEUE" envDefault:"notify.order_paid"`
	// ShutdownTimeout bounds the drain after SIGTERM.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"20s"`
}

// Check validates what parsing cannot; each error names its variable.
func (s *Shared) Check() []error {
	var errs []error
	if err := CheckDatabaseURL(s.DatabaseURL); err != nil {
		errs = append(errs, err)
	}
	if _, err := rabbitmq.ParseURLs(s.AMQPURL); err != nil {
		errs = append(errs, fmt.Errorf("AMQP_URL: %w", err))
	}
	if s.Exchange == "" || s.NotifyQueue == "" {
		errs = append(errs, errors.New("AMQP_EXCHANGE, NOTIFY_QUEUE: must not be empty"))
	}
	if s.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("SHUTDOWN_TIMEOUT: must be positive"))
	}
	return errs
}

// Names is the topology the process declares.
func (s *Shared) Names() rabbitmq.Names {
	n := rabbitmq.DefaultNames()
	n.Exchange = s.Exchange
	n.NotifyQueue = s.NotifyQueue
	n.NotifyDLQ = rabbitmq.DeadLetterQueueOf(s.NotifyQueue)
	return n
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
