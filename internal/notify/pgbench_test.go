package notify_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/postgres/pgbenchsql"
)

// TestPgbenchWorkerScriptMirrorsTheConsumer keeps the consumer's part of
// internal/notify/pgbench_worker.sql, which `make bench` runs with pgbench as
// the database's limit for the worker, in step with the statements
// HandleBatch really sends for a full batch (notify.BatchSize order.paid
// events): when they change, this fails until the script does too. (The
// script's sender part is a stand-in: one claim per 20 events and a mark by
// id per event.)
func TestPgbenchWorkerScriptMirrorsTheConsumer(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.newConsumer(t)
	rec, err := pgbenchsql.Record(f.db)
	require.NoError(t, err)
	var batch []amqp.Delivery
	for range notify.BatchSize {
		_, msg := f.paidOrder(t)
		batch = append(batch, amqp.Delivery{MessageId: msg.MessageID, Body: msg.Body})
	}

	rec.Start()
	require.Equal(t, make([]error, notify.BatchSize), c.HandleBatch(context.Background(), batch))
	got := rec.Stop()
	require.Equal(t, notify.BatchSize, f.count(t, `SELECT count(*) FROM notifications`))

	script, err := pgbenchsql.Script("pgbench_worker.sql")
	require.NoError(t, err)
	require.NotEmpty(t, got)
	require.GreaterOrEqual(t, len(script), len(got))
	require.Equal(t, script[:len(got)], got,
		"pgbench_worker.sql's first statements no longer send what the consumer sends: update the script")
}
