package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
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
			return SchemaReady(ctx, db, tables...)
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
	db, err := OpenDB(ctx, postgres.Config{URL: databaseURL}, logger)
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

	if err := WaitForSchema(ctx, db, logger, tables...); err != nil {
		conn.Close()
		postgres.Close(db)
		return nil, nil, err
	}
	return db, conn, nil
}
