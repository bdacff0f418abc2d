package rabbitmq_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

// declaringConn dials a Conn whose Setup declares f's topology and counts
// its runs, as the dispatcher's and the worker's do.
func declaringConn(t *testing.T, f fixture, setups *atomic.Int32) *rabbitmq.Conn {
	t.Helper()
	return rabbitmqtest.Dial(t, rabbitmqtest.URL(), func(c *rabbitmq.Config) {
		c.Setup = func(ch *amqp.Channel) error {
			setups.Add(1)
			return rabbitmq.DeclareTopology(ch, f.names)
		}
	})
}

// deleteQueue deletes queue from a channel of its own, as an operator's
// rabbitmqctl delete_queue would.
func deleteQueue(t *testing.T, f fixture, queue string) {
	t.Helper()
	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDelete(queue, false, false, false)
	require.NoError(t, err)
}

// consumers is how many consumers queue has, or -1 if it does not exist.
func consumers(t *testing.T, f fixture, queue string) int {
	t.Helper()
	q, ok := inspectQueue(t, f, queue)
	if !ok {
		return -1
	}
	return q.Consumers
}

// declaringPublisher is a Publisher on a declaringConn of f whose first
// message, evt_before, has been confirmed: the topology declared once.
func declaringPublisher(t *testing.T, f fixture, setups *atomic.Int32) *rabbitmq.Publisher {
	t.Helper()
	pub := rabbitmq.NewPublisher(declaringConn(t, f, setups), rabbitmq.PublisherConfig{Exchange: f.names.Exchange})
	t.Cleanup(func() { pub.Close() })
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_before")}))
	return pub
}

// TestConsumerResubscribesAfterItsQueueIsDeleted: deleting the queue makes
// the broker cancel its consumer, which amqp091 reports by closing the
// deliveries channel only, the channel itself staying open. The consumer
// must take that as the end of its session: the handler in flight finishes,
// and the next session declares the queue again and consumes it, so a
// message published afterwards is handled. Before, the session waited for
// the channel to close, forever, and the queue stayed gone.
func TestConsumerResubscribesAfterItsQueueIsDeleted(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var setups atomic.Int32
	conn := declaringConn(t, f, &setups)
	// The publisher is on the fixture's Conn, which has no Setup: only the
	// consumer can bring the queue back.
	pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange})
	defer pub.Close()

	started, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	rec := &recorder{fail: func(d amqp.Delivery) error {
		if d.MessageId == "evt_in_flight" {
			close(started)
			<-release
			finished.Store(true)
		}
		return nil
	}}
	runConsumer(t, rabbitmq.NewConsumer(conn, rabbitmq.ConsumerConfig{
		Queue: f.names.NotifyQueue, Concurrency: 2, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
	}, rec.handle))
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_in_flight")}))
	<-started

	deleteQueue(t, f, f.names.NotifyQueue)
	// The session waits for its handler before it ends: the queue stays
	// gone (nobody else declares it) while the handler holds the session.
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, -1, consumers(t, f, f.names.NotifyQueue), "no new session while a handler is in flight")
	close(release)

	eventually(t, 10*time.Second, func() bool { return consumers(t, f, f.names.NotifyQueue) == 1 },
		"the queue declared again and consumed")
	require.True(t, finished.Load(), "the handler in flight finished before the session ended")
	require.GreaterOrEqual(t, setups.Load(), int32(2), "Setup ran again without a reconnect")

	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_after")}))
	eventually(t, 10*time.Second, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, d := range rec.msgs {
			if d.MessageId == "evt_after" {
				return true
			}
		}
		return false
	}, "the message published after the deletion handled")
}

// TestPublishToADeletedQueueFailsUntilTheTopologyIsBack: with the queue
// gone, a publish is returned by the broker (mandatory) and fails instead
// of being confirmed into nothing; the Publisher then declares the topology
// again (its Conn's Setup) before its next send, so the same publish
// succeeds and reaches the queue, without a reconnect.
func TestPublishToADeletedQueueFailsUntilTheTopologyIsBack(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var setups atomic.Int32
	pub := declaringPublisher(t, f, &setups)
	require.Equal(t, int32(1), setups.Load())

	deleteQueue(t, f, f.names.NotifyQueue)
	errs := pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_lost")})
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], rabbitmq.ErrUnroutable, "returned, not confirmed into nothing")
	require.ErrorContains(t, errs[0], "312 NO_ROUTE")
	require.Equal(t, -1, consumers(t, f, f.names.NotifyQueue), "still gone: nothing declared it yet")

	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_lost")}),
		"the same publish succeeds once the Publisher declared the topology again")
	require.Equal(t, int32(2), setups.Load(), "declared again on the same connection")
	require.Equal(t, 1, queueDepth(t, f, f.names.NotifyQueue), "the re-published message is in the new queue")
}

// TestReturnedMessagesFailAloneInABatch: in one batch to an exchange where
// only some routing keys have a queue, exactly the returned messages fail,
// however the returns and confirms interleave.
func TestReturnedMessagesFailAloneInABatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange})
	defer pub.Close()
	var msgs []rabbitmq.Message
	for i := range 300 {
		id := fmt.Sprintf("evt_%03d", i)
		if i%3 == 1 {
			msgs = append(msgs, rabbitmq.Message{MessageID: id, RoutingKey: "product.updated", Body: []byte(`{}`)})
		} else {
			msgs = append(msgs, paid(id))
		}
	}
	for round := range 3 {
		errs := pub.Publish(context.Background(), msgs)
		for i, err := range errs {
			if msgs[i].RoutingKey == "product.updated" {
				require.ErrorIs(t, err, rabbitmq.ErrUnroutable, "round %d message %d", round, i)
			} else {
				require.NoError(t, err, "round %d message %d", round, i)
			}
		}
	}
	require.Equal(t, 3*200, queueDepth(t, f, f.names.NotifyQueue))
}

// TestPublishHealsAfterItsBindingsOrExchangeAreDeleted: a queue unbound
// from the exchange is the same as a deleted one to the publisher (its
// messages are returned, then the topology is declared again); a deleted
// exchange makes the broker close the channel with 404 NOT_FOUND, and the
// Publisher declares the topology on its next channel, so the publish after
// succeeds without a reconnect.
func TestPublishHealsAfterItsBindingsOrExchangeAreDeleted(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var setups atomic.Int32
	pub := declaringPublisher(t, f, &setups)

	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	for _, key := range f.names.NotifyBindings {
		require.NoError(t, ch.QueueUnbind(f.names.NotifyQueue, key, f.names.Exchange, nil))
	}
	require.NoError(t, ch.Close())
	errs := pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_2")})
	require.ErrorIs(t, errs[0], rabbitmq.ErrUnroutable, "unbound: returned")
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_2")}), "bound again")

	ch, err = f.conn.Channel(context.Background())
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDelete(f.names.Exchange, false, false))
	require.NoError(t, ch.Close())
	errs = pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_3")})
	require.Error(t, errs[0], "no exchange: the channel is closed")
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_3")}), "exchange declared again")
	require.Equal(t, int32(3), setups.Load(), "declared at the dial, after the return, after the 404; one connection")
	require.Equal(t, 3, queueDepth(t, f, f.names.NotifyQueue), "evt_before, evt_2 and evt_3 reached the queue")
}
