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

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/telemetry"
)

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

	amqpCfg.Prepare = func(conn *amqp.Connection) error { return rabbitmq.MigrateDLQ(conn, names, logger) }
	amqpCfg.Setup = func(ch *amqp.Channel) error { return rabbitmq.DeclareTopology(ch, names) }
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
