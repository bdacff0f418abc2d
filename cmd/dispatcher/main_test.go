package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/internal/testenv"
)

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestBadValueStopsStartNamingTheVariable(t *testing.T) {
	t.Parallel()
	tests := map[string]map[string]string{
		"LOG_LEVEL":         {"LOG_LEVEL": "loud"},
		"AMQP_URL":          {"AMQP_URL": "http://rabbit"},
		"DATABASE_URL":      {"DATABASE_URL": "postgres://x:y@:badport"},
		"METRICS_ADDR":      {"METRICS_ADDR": "9091"},
		"OUTBOX_BATCH_SIZE": {"OUTBOX_BATCH_SIZE": "0"},
	}
	for name, env := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := run(context.Background(), getenv(env), io.Discard)
			require.ErrorContains(t, err, name)
		})
	}
}

// opsAddr waits for the ops server's address in the log.
func opsAddr(t *testing.T, out *testenv.Output) string {
	t.Helper()
	return "http://" + testenv.LogValue(t, out, "ops server listening", "addr")
}

func TestRunRelaysServesOpsAndDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.NewDB(t)
	names := rabbitmqtest.NewNames(t)
	env := map[string]string{
		"DATABASE_URL": dbURL, "AMQP_URL": rabbitmqtest.URL(), "METRICS_ADDR": "127.0.0.1:0",
		"AMQP_EXCHANGE": names.Exchange, "NOTIFY_QUEUE": names.NotifyQueue, "OUTBOX_POLL_INTERVAL": "100ms",
	}
	out := &testenv.Output{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, getenv(env), out) }()
	t.Cleanup(cancel)
	base := opsAddr(t, out)

	require.NoError(t, outbox.Add(context.Background(), db, outbox.Event{Type: outbox.TypeOrderCreated, TenantID: "acme", AggregateID: "ord_1", Data: map[string]any{"id": "ord_1"}}))
	require.Eventually(t, func() bool {
		var n int
		db.Raw(`SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`).Scan(&n)
		return n == 1
	}, 10*time.Second, 20*time.Millisecond, "event published")

	status, _ := testenv.Get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, status)
	status, body := testenv.Get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, status, body)
	status, body = testenv.Get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "checkout_outbox_published_total 1")
	require.Contains(t, out.String(), `"AMQP_URL":"amqp://guest:***@`, "secrets masked in the config log")
	require.NotContains(t, out.String(), "guest:guest")

	cancel() // what SIGTERM does through signal.NotifyContext
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not drain within 20s")
	}
}

func TestReadyzNamesRabbitMQWhileTheBrokerIsUnreachable(t *testing.T) {
	t.Parallel()
	_, dbURL := pgtest.NewDB(t)
	env := map[string]string{"DATABASE_URL": dbURL, "AMQP_URL": "amqp://guest:guest@127.0.0.1:1/", "METRICS_ADDR": "127.0.0.1:0"}
	out := &testenv.Output{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, getenv(env), out) }()
	base := opsAddr(t, out)

	var failing map[string]any
	require.Eventually(t, func() bool {
		status, body := testenv.Get(t, base+"/readyz")
		var v struct{ Failing map[string]any }
		_ = json.Unmarshal([]byte(body), &v)
		failing = v.Failing
		return status == http.StatusServiceUnavailable && v.Failing["postgres"] == nil
	}, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, failing, "rabbitmq")
	status, _ := testenv.Get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, status, "alive while waiting")

	cancel()
	require.NoError(t, <-done)
}
