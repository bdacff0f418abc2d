// Package daemon holds what the background processes (dispatcher, worker)
// share around their loops: waiting for Postgres and RabbitMQ at start with
// readiness checks that name what is missing (Deps), and running the loops
// until a drain (RunLoops).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/telemetry"
)

// Process is a started background process: its ops server runs and its
// dependencies are open. Close releases them.
type Process struct {
	DB       *gorm.DB
	Conn     *rabbitmq.Conn
	Registry *prometheus.Registry // served on /metrics; register the loops' metrics here
	srv      *telemetry.Server
}

// Start begins the background process name ("dispatcher", "worker"): it
// serves /metrics, /healthz and /readyz on metricsAddr at once (/readyz
// failing, naming what is missing, until Postgres and RabbitMQ answer and
// tables exist), then opens Postgres and RabbitMQ as Deps.Open does. A
// metricsAddr that cannot be listened on is an error naming METRICS_ADDR.
// When ctx ends while it waits, Start returns (nil, nil): the process was
// stopped before it started.
func Start(ctx context.Context, name string, s *config.Shared, metricsAddr string, logger *slog.Logger, tables ...string) (*Process, error) {
	deps := &Deps{}
	p := &Process{Registry: telemetry.NewRegistry()}
	srv, err := telemetry.Serve(metricsAddr, p.Registry, deps.Checks(tables...)...)
	if err != nil {
		return nil, fmt.Errorf("METRICS_ADDR: %w", err)
	}
	p.srv = srv
	logger.Info("ops server listening", "addr", srv.Addr())
	p.DB, p.Conn, err = deps.Open(ctx, s.DatabaseURL, rabbitmq.Config{URL: s.AMQPURL, Name: name, Logger: logger}, s.Names(), logger, tables...)
	if err != nil {
		p.shutdownServer()
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, err
	}
	return p, nil
}

// Close closes the broker connection and the database, then stops the ops
// server (letting a scrape in flight finish, for up to 5s).
func (p *Process) Close() {
	p.Conn.Close()
	postgres.Close(p.DB)
	p.shutdownServer()
}

func (p *Process) shutdownServer() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.srv.Shutdown(ctx)
}

// Deps holds a background process's dependencies as they become available,
// so that the readiness checks can run before they are (and fail naming
// them). The zero value is ready to use.
type Deps struct {
	db   atomic.Pointer[gorm.DB]
	conn atomic.Pointer[rabbitmq.Conn]
}

// Checks returns the readiness checks "postgres" (reachable, and tables
// exist) and "rabbitmq" (a channel opens).
func (d *Deps) Checks(tables ...string) []telemetry.Check {
	return []telemetry.Check{
		{Name: "postgres", Ping: func(ctx context.Context) error {
			db := d.db.Load()
			if db == nil {
				return errors.New("not connected yet")
			}
			sqlDB, err := db.DB()
			if err != nil {
				return err
			}
			if err := sqlDB.PingContext(ctx); err != nil {
				return err
			}
			return postgres.SchemaReady(ctx, db, tables...)
		}},
		{Name: "rabbitmq", Ping: func(ctx context.Context) error {
			conn := d.conn.Load()
			if conn == nil {
				return errors.New("not connected yet")
			}
			return conn.Ping(ctx)
		}},
	}
}

// Open connects to Postgres and RabbitMQ, retrying each until it answers or
// ctx ends, declares the topology names on every broker connection, and
// waits until tables exist. The caller closes both on success.
func (d *Deps) Open(ctx context.Context, databaseURL string, amqpCfg rabbitmq.Config, names rabbitmq.Names, logger *slog.Logger, tables ...string) (*gorm.DB, *rabbitmq.Conn, error) {
	db, err := postgres.OpenRetrying(ctx, postgres.Config{URL: databaseURL}, logger)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	d.db.Store(db)

	topology := rabbitmq.NewTopology(names, logger)
	amqpCfg.Prepare = topology.Prepare
	amqpCfg.Setup = topology.Declare
	conn, err := rabbitmq.Dial(ctx, amqpCfg)
	if err != nil {
		postgres.Close(db)
		return nil, nil, fmt.Errorf("rabbitmq: %w", err)
	}
	d.conn.Store(conn)
	logger.Info("topology declared", "exchange", names.Exchange, "queue", names.NotifyQueue, "dlq", names.NotifyDLQ)

	if err := postgres.WaitForSchema(ctx, db, logger, tables...); err != nil {
		conn.Close()
		postgres.Close(db)
		return nil, nil, err
	}
	return db, conn, nil
}

// Loop is a background loop: it runs until ctx ends, finishes its work in
// flight, and returns nil, or returns an error if it cannot go on.
type Loop func(ctx context.Context) error

// RunLoops runs every loop until ctx ends or one returns an error (which
// stops the others), then waits up to drain for all of them to return. It
// returns the first loop error. A drain that takes longer is logged and
// abandoned: the durable state (outbox rows, notification claims) lets
// another process finish that work.
func RunLoops(ctx context.Context, drain time.Duration, logger *slog.Logger, loops ...Loop) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, l := range loops {
		g.Go(func() error { return l(gctx) })
	}
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		return err
	case <-gctx.Done():
	}
	logger.Info("draining", "timeout", drain.String())
	select {
	case err := <-done:
		return err
	case <-time.After(drain):
		logger.Error("drain timed out; work in flight is left to the durable state", "timeout", drain.String())
		return nil
	}
}
