// Package postgres opens the database of record, applies the embedded
// migrations, runs transactions and translates driver errors into the few
// conditions the rest of the code acts on.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"go.opentelemetry.io/otel/trace"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"

	"github.com/onceonly/checkout/internal/tracing"
	"github.com/onceonly/checkout/migrations"
)

// Config configures the connection pool.
type Config struct {
	// URL is a libpq connection URL, e.g.
	// "postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable".
	URL string
	// MaxConns caps open connections (default 20). Code must never query the
	// root handle inside a transaction, or a small pool deadlocks.
	MaxConns int
}

// Open connects with GORM over pgx's database/sql driver and checks the
// connection with a ping. It returns an error when the URL does not parse or
// the server does not answer before ctx ends.
func Open(ctx context.Context, cfg Config) (*gorm.DB, error) {
	connCfg, err := pgx.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	sqlDB := stdlib.OpenDB(*connCfg)
	maxConns := cfg.MaxConns
	if maxConns <= 0 {
		maxConns = 20
	}
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)

	db, err := gorm.Open(dialector{gormpg.Dialector{Config: &gormpg.Config{Conn: sqlDB}}}, &gorm.Config{
		Logger:                 gormlogger.Discard,
		SkipDefaultTransaction: true, // every write that matters runs in WithTx
		TranslateError:         false,
	})
	if err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("open gorm: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("ping postgres: %w", err)
	}
	return db, nil
}

// dialector is GORM's PostgreSQL dialector with an Explain that leaves the
// arguments out. GORM's Scan records every statement it runs with its
// arguments written into the text (Scan in gorm's finisher_api.go hands its
// logger.Recorder a Trace that always calls Explain), whatever the logger,
// and that formatting was 8% of the worker's CPU. Nothing here logs SQL;
// were it to, the text without the customers' data is the safer log.
type dialector struct{ gormpg.Dialector }

// Explain returns sql as it is, without vars.
func (dialector) Explain(sql string, _ ...any) string { return sql }

// Close closes the pool behind db.
func Close(db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.Close()
}

// MigrationLockID is the session advisory lock (pg_advisory_lock's bigint
// key, scoped to the database) Migrate holds while migrating, so that
// processes starting together apply each migration once.
const MigrationLockID = 0x636865636b6f7574 // "checkout"

// Migrate applies the embedded goose migrations under a session advisory
// lock. It is safe to call from several processes at once: the others wait
// for the lock (polled every second, for up to 5 minutes or until ctx ends),
// then find nothing left to apply.
//
// The lock and every migration run on one server connection, so db must
// reach PostgreSQL directly: PgBouncer in transaction pooling would take the
// lock on one server connection and run the migrations on others.
func Migrate(ctx context.Context, db *gorm.DB, logger *slog.Logger) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(MigrationLockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return err
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS,
		goose.WithSessionLocker(locker), goose.WithSlog(logger))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	for _, r := range results {
		logger.Info("migration applied", "version", r.Source.Version, "duration", r.Duration)
	}
	return nil
}

// WithTx runs fn in one transaction and commits it when fn returns nil.
//
// When fn returns an error, or panics, the transaction is rolled back and
// nothing it wrote is visible to anyone; the rollback does not depend on ctx,
// so a client that goes away cannot leave a connection inside a transaction.
// The commit error is returned as is: after a failed commit the caller must
// assume nothing was written. Inside fn use only tx, never the root handle, or
// a small pool can deadlock.
//
// The transaction is one client span, postgres.tx, parent of its
// statements': a client span, as every call to the database is, so one
// outside any trace (a sweep's, a poll's) is not recorded (tracing.Sampler).
func WithTx(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error) (err error) {
	ctx, span := tracing.Start(ctx, "postgres.tx", trace.WithSpanKind(trace.SpanKindClient))
	defer func() { tracing.End(span, err) }()
	tx := db.WithContext(ctx).Begin()
	if tx.Error != nil {
		return fmt.Errorf("begin: %w", tx.Error)
	}
	committed := false
	defer func() {
		if !committed {
			// database/sql rolls back on the transaction's own connection;
			// no context is involved.
			tx.Rollback()
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit().Error; err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	committed = true
	return nil
}

// IsDataException reports whether err is a data exception (SQLSTATE class
// 22): the server refused a value itself, e.g. a string with a NUL byte or
// a number out of range. Retrying the same statement fails the same way.
func IsDataException(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22")
}

// IsTransient reports whether err is a passing condition of the database or
// the connection to it rather than of the statement: the server unreachable
// or restarting, a connection lost, a deadline, a serialization failure or a
// deadlock. Retrying the same work later may succeed. Errors about the data
// itself (SQLSTATE classes 22 data exception, 23 integrity constraint
// violation, 42 syntax or access rule) are not transient: retrying them
// fails the same way.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", // connection exception
			"40", // transaction rollback: serialization failure, deadlock
			"53", // insufficient resources
			"57", // operator intervention: admin shutdown, query canceled
			"58": // system error
			return true
		}
		return false
	}
	// Anything that is not an answer from the server (dial errors, a
	// connection closed under us, timeouts, context deadlines) is the
	// connection's trouble, not the statement's.
	return true
}

// TextArray returns ss as a PostgreSQL text[] literal, e.g. {"a","b\"c"}
// for []string{"a", `b"c`}, to bind as one parameter (`= ANY(?::text[])`):
// GORM would expand a Go slice into one parameter per element. Every element
// is quoted, with '"' and '\\' escaped (PostgreSQL, "Array Value Input").
func TextArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// IntArray returns ns as a PostgreSQL bigint[] literal, e.g. {1,2,3}, to
// bind as one parameter (`unnest(?::bigint[])`), as TextArray does for text.
func IntArray(ns []int64) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(n, 10))
	}
	b.WriteByte('}')
	return b.String()
}
