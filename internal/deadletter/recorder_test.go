package deadletter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/checkout/internal/deadletter"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// run runs loop until the test ends and checks that it returned nil.
func run(t *testing.T, loop func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// TestBackstopDeadLetterIsRecorded: a message RabbitMQ dead-letters by
// itself, past the queue's x-delivery-limit (the backstop, here 2 returns),
// reaches the dead-letter queue with the broker's x-death history, and the
// Recorder writes it down with reason delivery_limit, its queue and its
// event type, on this machine's RabbitMQ.
func TestBackstopDeadLetterIsRecorded(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	names := rabbitmqtest.NewNames(t)
	names.DeliveryLimit, names.BackstopLimit = 2, 2
	conn := rabbitmqtest.Dial(t, rabbitmqtest.URL())
	ch, err := conn.Channel(context.Background())
	require.NoError(t, err)
	_, err = ch.QueueDelete(names.NotifyQueue, false, false, false)
	require.NoError(t, err)
	require.NoError(t, rabbitmq.DeclareTopology(ch, names))
	ch.Close()

	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: names.Exchange})
	t.Cleanup(func() { pub.Close() })
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{
		{MessageID: "evt_crash", RoutingKey: "order.paid", Body: []byte(`{"id":"evt_crash"}`)}}))
	// A consumer that does not count: every failure is a broker return.
	run(t, rabbitmq.NewConsumer(conn, rabbitmq.ConsumerConfig{Queue: names.NotifyQueue, MinBackoff: 10 * time.Millisecond},
		func(context.Context, amqp.Delivery) error { return errors.New("crashes the process") }).Run)
	rec, err := deadletter.NewRecorder(db, conn, deadletter.RecorderConfig{Queue: names.NotifyDLQ})
	require.NoError(t, err)
	run(t, rec.Run)

	var letters []deadletter.Letter
	require.Eventually(t, func() bool {
		letters, err = deadletter.Unresolved(context.Background(), db, deadletter.Filter{})
		require.NoError(t, err)
		return len(letters) == 1
	}, 20*time.Second, 20*time.Millisecond, "the backstop's dead letter recorded")
	l := letters[0]
	require.Equal(t, deadletter.ReasonDeliveryLimit, l.Reason)
	require.Equal(t, names.NotifyQueue, l.Queue)
	require.Equal(t, "evt_crash", l.MessageID)
	require.Equal(t, "order.paid", l.RoutingKey)
	require.Equal(t, `{"id":"evt_crash"}`, string(l.Body))
	require.Contains(t, string(l.Headers), "x-death")
}
