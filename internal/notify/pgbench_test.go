package notify_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres/pgbenchsql"
)

// TestPgbenchWorkerScriptMirrorsTheConsumer keeps the consumer's part of
// internal/notify/pgbench_worker.sql, which `make bench` runs with pgbench as
// the database's limit for the worker, in step with the statements Handle
// really sends: when they change, this fails until the script does too.
// (The script's sender part is a stand-in: one claim per 20 events and a
// mark by id.)
func TestPgbenchWorkerScriptMirrorsTheConsumer(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.newConsumer(t)
	rec, err := pgbenchsql.Record(f.db)
	require.NoError(t, err)
	_, msg := f.paidOrder(t)

	rec.Start()
	require.NoError(t, c.Handle(context.Background(), amqp.Delivery{MessageId: msg.MessageID, Body: msg.Body}))
	got := rec.Stop()

	script, err := pgbenchsql.Script("pgbench_worker.sql")
	require.NoError(t, err)
	require.NotEmpty(t, got)
	require.GreaterOrEqual(t, len(script), len(got))
	require.Equal(t, script[:len(got)], got,
		"pgbench_worker.sql's first statements no longer send what the consumer sends: update the script")
}
