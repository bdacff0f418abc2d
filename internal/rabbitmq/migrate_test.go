package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

// olderNotifyQueue replaces the test topology's notification queue with
// one declared as versions before v4 did (a delivery limit of 4 returns),
// holding n messages, and binds it again.
func olderNotifyQueue(t *testing.T, f fixture, n int) {
	t.Helper()
	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDelete(f.names.NotifyQueue, false, false, false)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(f.names.NotifyQueue, true, false, false, false, rabbitmq.LegacyNotifyQueueArgs(f.names))
	require.NoError(t, err)
	for _, key := range f.names.NotifyBindings {
		require.NoError(t, ch.QueueBind(f.names.NotifyQueue, key, f.names.Exchange, false, nil))
	}
	for range n {
		require.NoError(t, ch.PublishWithContext(context.Background(), "", f.names.NotifyQueue, false, false,
			amqp.Publishing{MessageId: "evt_old", Body: []byte(`{}`), DeliveryMode: amqp.Persistent}))
	}
	require.Eventually(t, func() bool { return queueDepth(t, f, f.names.NotifyQueue) == n }, 5*time.Second, 20*time.Millisecond)
}

// dialTopology dials as daemon.Deps.Open does, with a Topology.
func dialTopology(t *testing.T, names rabbitmq.Names) (*rabbitmq.Conn, *rabbitmq.Topology) {
	t.Helper()
	topo := rabbitmq.NewTopology(names, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, rabbitmq.Config{URL: rabbitmqtest.URL(), Prepare: topo.Prepare, Setup: topo.Declare})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn, topo
}

// declaresWithV4Arguments reports whether the broker takes this version's
// declaration of the notification queue as it is (no PRECONDITION_FAILED).
func declaresWithV4Arguments(t *testing.T, f fixture) bool {
	t.Helper()
	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	return rabbitmq.DeclareTopology(ch, f.names) == nil
}

// TestTopologyIsAcceptedWithTheBackstopLimit: this machine's RabbitMQ
// (3.10) takes the v4 declaration, a quorum queue whose broker-side
// x-delivery-limit is the backstop, and refuses the declaration of before
// v4 on it, as it refuses any change of a queue's arguments.
func TestTopologyIsAcceptedWithTheBackstopLimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.True(t, declaresWithV4Arguments(t, f))
	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(f.names.NotifyQueue, true, false, false, false, rabbitmq.LegacyNotifyQueueArgs(f.names))
	var ae *amqp.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, amqp.PreconditionFailed, ae.Code)
}

// TestMigrateNotifyQueueReplacesAnOlderEmptyQueue: the empty, unused queue
// of an older version is replaced at connect, so restarts stop counting.
func TestMigrateNotifyQueueReplacesAnOlderEmptyQueue(t *testing.T) {
	t.Parallel()
	f := setup(t)
	olderNotifyQueue(t, f, 0)
	require.False(t, declaresWithV4Arguments(t, f))

	_, topo := dialTopology(t, f.names)
	require.False(t, topo.Legacy())
	require.True(t, declaresWithV4Arguments(t, f), "the queue has the v4 arguments")
}

// TestMigrateNotifyQueueKeepsAnOlderQueueWithMessages: an older queue that
// holds events is kept and declared as it is, so the process starts and
// consumes them; once it is empty and unused, the next connection
// replaces it.
func TestMigrateNotifyQueueKeepsAnOlderQueueWithMessages(t *testing.T) {
	t.Parallel()
	f := setup(t)
	olderNotifyQueue(t, f, 2)

	conn, topo := dialTopology(t, f.names)
	require.True(t, topo.Legacy())
	rec := &recorder{}
	c := rabbitmq.NewConsumer(conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyQueue}, rec.handle)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	eventually(t, 5*time.Second, func() bool { return rec.count() == 2 }, "both older events consumed")
	require.Eventually(t, func() bool { return queueDepth(t, f, f.names.NotifyQueue) == 0 }, 5*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.False(t, declaresWithV4Arguments(t, f), "still the older queue")

	_, topo = dialTopology(t, f.names)
	require.False(t, topo.Legacy())
	require.True(t, declaresWithV4Arguments(t, f), "replaced once empty and unused")
}

// TestTopologyFollowsAQueueReplacedUnderIt: a process that kept an older
// queue (Legacy) declares the v4 one after another process replaced it:
// its first declaration is refused, the next one succeeds, so its
// consumer's next session and its publisher's next send go on.
func TestTopologyFollowsAQueueReplacedUnderIt(t *testing.T) {
	t.Parallel()
	f := setup(t)
	olderNotifyQueue(t, f, 1)
	conn, topo := dialTopology(t, f.names)
	require.True(t, topo.Legacy())

	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	_, err = ch.QueueDelete(f.names.NotifyQueue, false, false, false)
	require.NoError(t, err)
	require.NoError(t, rabbitmq.DeclareTopology(ch, f.names))
	ch.Close()

	ch, err = conn.Channel(context.Background())
	require.NoError(t, err)
	require.Error(t, topo.Declare(ch), "declared as the older queue")
	ch, err = conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, topo.Declare(ch))
	require.False(t, topo.Legacy())
}
