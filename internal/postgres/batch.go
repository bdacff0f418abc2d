package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/tracing"
)

// A Batch is one transaction sent to PostgreSQL in one round trip: the
// statements of several tables' owners, queued by each owner's own Go API
// (orders.QueueInsert, outbox.Queue, ...), run in order in one implicit
// transaction that commits all of them or none (pgx's SendBatch, the
// protocol's pipeline: every statement before the one Sync is one
// transaction; https://www.postgresql.org/docs/15/protocol-flow.html,
// "Pipelining").
//
// A statement that cannot do what it is queued for (the key is no longer
// leased to the run, the order has moved on, the attempt was written by
// another run) is a guard (QueueGuarded): it fails with SQLSTATE CKG01 and
// its name (migration 00013's batch_guard), PostgreSQL skips the rest, and
// nothing of the batch is written. IsGuard tells the caller which one
// failed. So a path that writes several owners' tables in one round trip
// needs no SQL of one package inside another's.
//
// Sent on a transaction instead (a *gorm.DB inside WithTx), the same
// statements run one after the other inside it, a round trip each: an
// owner's statements serve a batch and a transaction alike.
//
// The zero Batch is empty and ready to use. A Batch is sent once.
type Batch struct {
	items  []batchItem
	async  bool
	onDone []func()
}

type batchItem struct {
	sql  string
	args []any
	scan func(pgx.Row) error
}

// GuardCode is the SQLSTATE of a failed guard (migration 00013).
const GuardCode = "CKG01"

// Queue adds query, written with GORM's ? placeholders (turned into $1,
// $2, ... here; a ? inside a quoted literal is left alone), and its args.
// scan, when not nil, reads the statement's first row once the batch is
// sent (pgx.ErrNoRows when it returned none); a scan error fails Send.
// Args are encoded by pgx as they are for GORM's queries: slices are not
// expanded, so a list is one array argument (= ANY(?::text[])).
func (b *Batch) Queue(query string, args []any, scan func(pgx.Row) error) {
	b.items = append(b.items, batchItem{sql: numbered(query), args: args, scan: scan})
}

// QueueGuarded adds query, which must return its rows (a SELECT, or a
// write with RETURNING), as the guard named guard: when it returns no row
// the batch fails (IsGuard(err, guard)) and nothing of it is written.
// scan, when not nil, reads its first row.
func (b *Batch) QueueGuarded(guard, query string, args []any, scan func(pgx.Row) error) {
	// The guard's CTE is read first and whatever query returns, so it runs
	// even when query returns nothing (MATERIALIZED: exactly once).
	b.Queue(`WITH g AS (`+query+`),
		ok AS MATERIALIZED (SELECT batch_guard(EXISTS (SELECT 1 FROM g), ?) AS held)
		SELECT g.* FROM ok LEFT JOIN g ON true`, append(args[:len(args):len(args)], guard), scan)
}

// CommitWithoutFlush makes the batch commit without waiting for its WAL
// to reach disk (synchronous_commit off for this transaction alone): a
// crash of PostgreSQL itself, never of this process, can lose it, and
// with it only what came after it in the WAL. For a batch whose loss a
// resumption repeats safely.
func (b *Batch) CommitWithoutFlush() { b.async = true }

// AfterCommit adds fn to what Send calls once the whole batch committed
// (sent on a transaction: once all of its statements ran), in the order
// added: where an owner updates its Go values (a claim finished, an
// attempt's id) from what its statements returned, so that a batch that
// failed after them leaves those values as they were.
func (b *Batch) AfterCommit(fn func()) { b.onDone = append(b.onDone, fn) }

// Len returns how many statements are queued.
func (b *Batch) Len() int { return len(b.items) }

// Send runs b on one connection of db's pool, in one round trip, and reads
// every result: nil when all of it committed (and then it calls the
// AfterCommit functions); the first statement's error otherwise (IsGuard
// for a guard), and then nothing of it was written. An error of the
// connection itself (ctx ended, the server gone) leaves the outcome
// unknown, as a lost commit does.
//
// When db is a transaction, Send runs b's statements in it, in order, and
// returns the first error; the caller rolls the transaction back then.
// CommitWithoutFlush applies to the rest of that transaction.
//
// The batch is one client span, postgres.batch, with its statement count
// (not recorded outside any trace, as WithTx's).
func Send(ctx context.Context, db *gorm.DB, b *Batch) (err error) {
	ctx, span := tracing.Start(ctx, "postgres.batch", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int("db.operation.batch.size", len(b.items))))
	defer func() { tracing.End(span, err) }()
	items := b.items
	if b.async {
		// First, so that it holds for the whole transaction: set_config's
		// local value lasts until the transaction ends and is read at commit.
		items = append([]batchItem{{sql: `SELECT set_config('synchronous_commit', 'off', true)`}}, items...)
	}
	if o, ok := db.Config.Plugins[BatchObserverName].(BatchObserver); ok {
		stmts := make([]string, len(items))
		for i, it := range items {
			stmts[i] = it.sql
		}
		o.ObserveBatch(stmts)
	}
	if _, inTx := db.Statement.ConnPool.(gorm.TxCommitter); inTx {
		err = sendInTx(ctx, db.Statement.ConnPool, items)
	} else {
		err = sendPipelined(ctx, db, items)
	}
	if err != nil {
		return err
	}
	for _, fn := range b.onDone {
		fn()
	}
	return nil
}

// sendPipelined sends items as one pgx batch on a connection of db's pool.
func sendPipelined(ctx context.Context, db *gorm.DB, items []batchItem) error {
	var pb pgx.Batch
	for _, it := range items {
		q := pb.Queue(it.sql, it.args...)
		if it.scan != nil {
			q.QueryRow(it.scan)
		} else {
			q.Exec(func(pgconn.CommandTag) error { return nil })
		}
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("batch: connection: %w", err)
	}
	defer conn.Close()
	return conn.Raw(func(driverConn any) error {
		c, ok := driverConn.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("batch: driver connection is %T, not pgx's", driverConn)
		}
		return c.Conn().SendBatch(ctx, &pb).Close()
	})
}

// sendInTx runs items one after the other in the transaction tx.
func sendInTx(ctx context.Context, tx gorm.ConnPool, items []batchItem) error {
	for _, it := range items {
		if it.scan == nil {
			if _, err := tx.ExecContext(ctx, it.sql, it.args...); err != nil {
				return err
			}
			continue
		}
		if err := it.scan(sqlRow{tx.QueryRowContext(ctx, it.sql, it.args...)}); err != nil {
			return err
		}
	}
	return nil
}

// sqlRow is a database/sql row as a pgx.Row: no row is pgx.ErrNoRows.
type sqlRow struct{ r *sql.Row }

func (r sqlRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return err
}

// BatchObserverName is the name under which a BatchObserver is registered
// on a *gorm.DB (db.Use).
const BatchObserverName = "postgres:batch_observer"

// A BatchObserver, registered on a *gorm.DB as the GORM plugin named
// BatchObserverName, sees the statements of every batch Send sends through
// that db, as sent ($n placeholders), since GORM's own callbacks never
// see them: pgbenchsql's recorder, which keeps `make bench`'s pgbench
// script in step with the code.
type BatchObserver interface {
	gorm.Plugin
	ObserveBatch(stmts []string)
}

// IsGuard reports whether err is the failure of the guard named guard
// (any guard for ""): the batch it ended wrote nothing.
func IsGuard(err error, guard string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == GuardCode && (guard == "" || pgErr.ConstraintName == guard)
}

// numberedCache holds numbered's answers: the owners' statements are a
// few constant strings (and a few lists of up to a batch's size), sent
// thousands of times a second.
var numberedCache sync.Map // string -> string

// numbered returns query with its ? placeholders numbered $1, $2, ...,
// leaving a ? inside a single-quoted literal or a double-quoted name.
func numbered(query string) string {
	if v, ok := numberedCache.Load(query); ok {
		return v.(string)
	}
	n := number(query)
	numberedCache.Store(query, n)
	return n
}

func number(query string) string {
	if !strings.Contains(query, "?") {
		return query
	}
	var sb strings.Builder
	sb.Grow(len(query) + 16)
	n := 0
	var quote byte
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			sb.WriteByte('$')
			sb.WriteString(strconv.Itoa(n))
			continue
		}
		sb.WriteByte(c)
	}
	return sb.String()
}
