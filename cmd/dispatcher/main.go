// Command dispatcher is the outbox relay: it publishes the events that
// checkout transactions write to the outbox table to the RabbitMQ exchange
// checkout.events, with publisher confirms, and marks them published
// (CONTRACT.md, "Events"). Any number may run at once. It does not migrate:
// it waits until the API has created the schema.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/ops"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/telemetry"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher:", err)
		os.Exit(1)
	}
}

// settings are the dispatcher's environment variables (CONTRACT.md).
type settings struct {
	DatabaseURL     string        `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable"`
	AMQPURL         string        `env:"AMQP_URL" envDefault:"amqp://guest:guest@127.0.0.1:5672/"`
	MetricsAddr     string        `env:"METRICS_ADDR" envDefault:":9091"`
	LogLevel        slog.Level    `env:"LOG_LEVEL" envDefault:"info"`
	Exchange        string        `env:"AMQP_EXCHANGE" envDefault:"checkout.events"`
	NotifyQueue     string        `env:"NOTIFY_QUEUE" envDefault:"notify.order_paid"`
	PollInterval    time.Duration `env:"OUTBOX_POLL_INTERVAL" envDefault:"1s"`
	BatchSize       int           `env:"OUTBOX_BATCH_SIZE" envDefault:"100"`
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"20s"`
}

// check validates what parsing cannot; each message names its variable.
func (s *settings) check() error {
	var errs []error
	if _, err := pgx.ParseConfig(s.DatabaseURL); err != nil {
		errs = append(errs, fmt.Errorf("DATABASE_URL: %w", err))
	}
	if _, err := amqp.ParseURI(s.AMQPURL); err != nil {
		errs = append(errs, fmt.Errorf("AMQP_URL: %w", err))
	}
	if _, _, err := net.SplitHostPort(s.MetricsAddr); err != nil {
		errs = append(errs, fmt.Errorf("METRICS_ADDR: %w", err))
	}
	if s.Exchange == "" || s.NotifyQueue == "" {
		errs = append(errs, errors.New("AMQP_EXCHANGE, NOTIFY_QUEUE: must not be empty"))
	}
	if s.PollInterval <= 0 {
		errs = append(errs, errors.New("OUTBOX_POLL_INTERVAL: must be positive"))
	}
	if s.BatchSize < 1 || s.BatchSize > 1000 {
		errs = append(errs, errors.New("OUTBOX_BATCH_SIZE: must be between 1 and 1000"))
	}
	if s.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("SHUTDOWN_TIMEOUT: must be positive"))
	}
	return errors.Join(errs...)
}

// names is the topology this process declares.
func (s *settings) names() rabbitmq.Names {
	n := rabbitmq.DefaultNames()
	n.Exchange = s.Exchange
	n.NotifyQueue = s.NotifyQueue
	n.NotifyDLQ = s.NotifyQueue + ".dlq"
	return n
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	var s settings
	if err := config.Load(getenv, &s); err != nil {
		return err
	}
	if err := s.check(); err != nil {
		return err
	}
	logger := telemetry.NewLogger(stdout, s.LogLevel).With("process", "dispatcher")
	logger.Info("starting dispatcher", config.Masked(&s)...)

	deps := &ops.Deps{}
	reg := telemetry.NewRegistry()
	srv, err := ops.Serve(s.MetricsAddr, reg, deps.Checks("outbox")...)
	if err != nil {
		return fmt.Errorf("METRICS_ADDR: %w", err)
	}
	logger.Info("ops server listening", "addr", srv.Addr())
	defer func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdownCtx)
	}()

	db, conn, err := deps.Open(ctx, s.DatabaseURL, rabbitmq.Config{URL: s.AMQPURL, Name: "dispatcher", Logger: logger}, s.names(), logger, "outbox")
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for dependencies
		}
		return err
	}
	defer postgres.Close(db)
	defer conn.Close()

	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: s.Exchange, ConfirmTimeout: 5 * time.Second, Logger: logger})
	defer pub.Close()
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{
		ListenURL:    s.DatabaseURL,
		PollInterval: s.PollInterval,
		BatchSize:    s.BatchSize,
		Logger:       logger,
		Registerer:   reg,
	})
	if err != nil {
		return err
	}

	logger.Info("dispatcher running")
	err = ops.RunLoops(ctx, s.ShutdownTimeout, logger,
		relay.Run,
	)
	logger.Info("dispatcher stopped", "err", err)
	return err
}
