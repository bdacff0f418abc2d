package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/internal/testenv"
)

// TestRedriveCommandSendsADeadLetterOnce: the running worker records an
// order.paid its consumer dead-lettered (in dead_letters and /metrics);
// `worker redrive-dead-letters` sends it through again and the order gets
// one email; run again, it finds nothing to send.
func TestRedriveCommandSendsADeadLetterOnce(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.NewDB(t)
	env, names, sink := workerEnv(t, dbURL, map[string]string{"NOTIFY_SWEEP_INTERVAL": "50ms"})
	out := &testenv.Output{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dispatch(ctx, nil, getenv(env), out) }()
	t.Cleanup(func() { cancel(); <-done })
	base := opsAddr(t, out)

	orderID := ids.New("ord")
	require.NoError(t, db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES (?, 'acme', 'paid', 'buyer@example.com', 'usd', 1200, 'pm_card_visa', now(), now())`, orderID).Error)
	ev := outbox.Event{ID: outbox.NewID(), Type: outbox.TypeOrderPaid, OccurredAt: time.Now().UTC(), TenantID: "acme",
		Data: map[string]any{"id": orderID, "status": "paid", "email": "buyer@example.com", "currency": "usd", "amount_total": 1200}}
	body, err := json.Marshal(ev)
	require.NoError(t, err)
	// As the consumer dead-letters an event after its fifth failure.
	conn := rabbitmqtest.Dial(t, rabbitmqtest.URL())
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: ""})
	t.Cleanup(func() { pub.Close() })
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{{
		MessageID: ev.ID, RoutingKey: names.NotifyDLQ, Type: outbox.TypeOrderPaid, Body: body,
		Headers: map[string]any{rabbitmq.HeaderDeadLetteredFrom: names.NotifyQueue, rabbitmq.HeaderFailures: int32(5),
			rabbitmq.HeaderLastError: "a bug", rabbitmq.HeaderRoutingKey: outbox.TypeOrderPaid},
	}}))

	require.Eventually(t, func() bool {
		_, metrics := testenv.Get(t, base+"/metrics")
		return strings.Contains(metrics, "checkout_dead_letters_unresolved 1")
	}, 10*time.Second, 20*time.Millisecond, "dead letter recorded")
	_, metrics := testenv.Get(t, base+"/metrics")
	require.Contains(t, metrics, `checkout_dead_letters_total{queue="`+names.NotifyQueue+`",reason="handler_failed"} 1`)
	require.Zero(t, sink.Len())

	var cmdOut strings.Builder
	require.NoError(t, dispatch(context.Background(), []string{"redrive-dead-letters"}, getenv(env), &cmdOut))
	require.Equal(t, "redrove 1 dead letters\n", cmdOut.String())
	require.Eventually(t, func() bool { return sink.Len() == 1 }, 10*time.Second, 20*time.Millisecond, "the email sent")

	cmdOut.Reset()
	require.NoError(t, dispatch(context.Background(), []string{"redrive-dead-letters", "-message", ev.ID}, getenv(env), &cmdOut))
	require.Equal(t, "redrove 0 dead letters\n", cmdOut.String())
	require.Equal(t, 1, sink.Len())
}
