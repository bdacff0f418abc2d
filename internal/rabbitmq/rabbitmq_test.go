package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fixture is what every test here starts from.
type fixture struct {
	names rabbitmq.Names
	conn  *rabbitmq.Conn
}

func setup(t *testing.T) fixture {
	t.Helper()
	return fixture{names: rabbitmqtest.NewNames(t), conn: rabbitmqtest.Dial(t, rabbitmqtest.URL())}
}

// recorder is a Handler that keeps what it was given.
type recorder struct {
	mu   sync.Mutex
	msgs []amqp.Delivery
	fail func(d amqp.Delivery) error
}

func (r *recorder) handle(_ context.Context, d amqp.Delivery) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, d)
	r.mu.Unlock()
	if r.fail != nil {
		return r.fail(d)
	}
	return nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// runConsumer runs c until the test ends and checks that Run returned nil.
func runConsumer(t *testing.T, c *rabbitmq.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func eventually(t *testing.T, within time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, within, 10*time.Millisecond, fmt.Sprintf(msg, args...))
}

func paid(id string) rabbitmq.Message {
	return rabbitmq.Message{MessageID: id, RoutingKey: "order.paid", Body: []byte(`{"id":"` + id + `"}`)}
}

func TestPublishConfirmedAndConsumedWithProperties(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange})
	defer pub.Close()

	errs := pub.Publish(context.Background(), []rabbitmq.Message{
		paid("evt_1"),
		{MessageID: "evt_2", RoutingKey: "product.updated", Body: []byte(`{}`)}, // no queue: returned, an error
		paid("evt_3"),
	})
	require.Len(t, errs, 3)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], rabbitmq.ErrUnroutable)
	require.ErrorContains(t, errs[1], "312 NO_ROUTE")
	require.NoError(t, errs[2])

	rec := &recorder{}
	runConsumer(t, rabbitmq.NewConsumer(f.conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyQueue, Concurrency: 1}, rec.handle))
	eventually(t, 5*time.Second, func() bool { return rec.count() == 2 }, "two order.paid deliveries")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	d := rec.msgs[0]
	require.Equal(t, "evt_1", d.MessageId)
	require.Equal(t, "order.paid", d.Type)
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, `{"id":"evt_1"}`, string(d.Body))
	require.Equal(t, "evt_3", rec.msgs[1].MessageId)
}

// TestNotifyQueueTakesEachOrderEventOnce: the queue is bound to order.paid,
// as the contract says, and to order.* for the worker's sequence; an
// order.paid matches both bindings and must still arrive once, and an event
// of anything else not at all (it is returned to the publisher).
func TestNotifyQueueTakesEachOrderEventOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.Contains(t, f.names.NotifyBindings, "order.paid")
	pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange})
	defer pub.Close()
	types := []string{"order.created", "order.paid", "order.payment_failed", "order.refunded", "order.canceled", "product.updated"}
	msgs := make([]rabbitmq.Message, len(types))
	for i, typ := range types {
		msgs[i] = rabbitmq.Message{MessageID: "evt_" + typ, RoutingKey: typ, Body: []byte(`{}`)}
	}
	errs := pub.Publish(context.Background(), msgs)
	for i, typ := range types {
		if typ == "product.updated" {
			require.ErrorIs(t, errs[i], rabbitmq.ErrUnroutable, "no queue takes %s", typ)
		} else {
			require.NoError(t, errs[i], typ)
		}
	}

	rec := &recorder{}
	runConsumer(t, rabbitmq.NewConsumer(f.conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyQueue}, rec.handle))
	eventually(t, 5*time.Second, func() bool { return rec.count() >= 5 }, "five order events delivered")
	time.Sleep(300 * time.Millisecond) // room for a second copy to arrive
	rec.mu.Lock()
	defer rec.mu.Unlock()
	got := map[string]int{}
	for _, d := range rec.msgs {
		got[d.RoutingKey]++
	}
	require.Equal(t, map[string]int{"order.created": 1, "order.paid": 1, "order.payment_failed": 1, "order.refunded": 1, "order.canceled": 1}, got)
}

func TestFailingMessageIsDeadLetteredAfterFiveDeliveries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange})
	defer pub.Close()
	require.Equal(t, []error{nil, nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_poison"), paid("evt_good")}))

	rec := &recorder{fail: func(d amqp.Delivery) error {
		if d.MessageId == "evt_poison" {
			return errors.New("poison")
		}
		return nil
	}}
	runConsumer(t, rabbitmq.NewConsumer(f.conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyQueue,
		FailureLimit: f.names.DeliveryLimit, DeadLetterQueue: f.names.NotifyDLQ}, rec.handle))

	dlq := &recorder{}
	runConsumer(t, rabbitmq.NewConsumer(f.conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyDLQ}, dlq.handle))
	eventually(t, 10*time.Second, func() bool { return dlq.count() == 1 }, "poison message in the DLQ")

	rec.mu.Lock()
	perID := map[string]int{}
	for _, d := range rec.msgs {
		perID[d.MessageId]++
	}
	rec.mu.Unlock()
	require.Equal(t, map[string]int{"evt_poison": 5, "evt_good": 1}, perID)
	// The dead letter is the message as published, with why and how often
	// it failed and where.
	d := dlq.msgs[0]
	require.Equal(t, "evt_poison", d.MessageId)
	require.Equal(t, "order.paid", d.Type)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, `{"id":"evt_poison"}`, string(d.Body))
	require.Equal(t, 5, rabbitmq.Failures(d))
	require.Equal(t, "poison", d.Headers[rabbitmq.HeaderLastError])
	require.Equal(t, "order.paid", rabbitmq.OriginalRoutingKey(d))
	require.Equal(t, f.names.NotifyQueue, d.Headers[rabbitmq.HeaderDeadLetteredFrom])
}

func TestConfirmWaitEndsAfterTimeoutWhenTheBrokerIsSilent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	proxy := rabbitmqtest.NewProxy(t, brokerHostPort(t))
	conn := rabbitmqtest.Dial(t, proxiedURL(t, proxy))
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange, ConfirmTimeout: 300 * time.Millisecond})
	defer pub.Close()
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_a")}))

	proxy.Blackhole(true)
	start := time.Now()
	errs := pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_b"), paid("evt_c")})
	require.Less(t, time.Since(start), 3*time.Second)
	require.ErrorIs(t, errs[0], rabbitmq.ErrConfirmTimeout)
	require.ErrorIs(t, errs[1], rabbitmq.ErrConfirmTimeout)

	// The network heals: the publisher drops its doubtful channel and goes on.
	proxy.Blackhole(false)
	proxy.CutAll()
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_d")}))
}

func TestConfirmWaitEndsWhenTheConnectionDies(t *testing.T) {
	t.Parallel()
	f := setup(t)
	proxy := rabbitmqtest.NewProxy(t, brokerHostPort(t))
	conn := rabbitmqtest.Dial(t, proxiedURL(t, proxy))
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange, ConfirmTimeout: time.Minute})
	defer pub.Close()
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_a")}))

	proxy.Blackhole(true)
	done := make(chan []error, 1)
	go func() { done <- pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_b")}) }()
	// Give the publish time to reach the wait, then kill the connection.
	time.Sleep(100 * time.Millisecond) // not a synchronisation: either order must pass
	proxy.Blackhole(false)
	proxy.CutAll()
	select {
	case errs := <-done:
		require.Error(t, errs[0])
	case <-time.After(10 * time.Second):
		t.Fatal("confirm wait did not end when the connection died")
	}
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_c")}))
}

func TestConsumerAndPublisherRecoverFromCutConnections(t *testing.T) {
	t.Parallel()
	f := setup(t)
	proxy := rabbitmqtest.NewProxy(t, brokerHostPort(t))
	var setups atomic.Int32
	conn := rabbitmqtest.Dial(t, proxiedURL(t, proxy), func(c *rabbitmq.Config) {
		c.Setup = func(ch *amqp.Channel) error {
			setups.Add(1)
			return rabbitmq.DeclareTopology(ch, f.names)
		}
	})
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange, ConfirmTimeout: 2 * time.Second})
	defer pub.Close()

	var mu sync.Mutex
	seen := map[string]int{}
	runConsumer(t, rabbitmq.NewConsumer(conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyQueue, MinBackoff: 10 * time.Millisecond}, func(_ context.Context, d amqp.Delivery) error {
		mu.Lock()
		seen[d.MessageId]++
		mu.Unlock()
		return nil
	}))

	const n = 300
	for i := range n {
		id := fmt.Sprintf("evt_%03d", i)
		// Retry until confirmed, as the relay does: at least once.
		eventually(t, 10*time.Second, func() bool {
			return pub.Publish(context.Background(), []rabbitmq.Message{paid(id)})[0] == nil
		}, "publish %s", id)
		if i%100 == 50 {
			require.Positive(t, proxy.CutAll())
		}
	}
	eventually(t, 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}, "every message consumed")
	require.GreaterOrEqual(t, setups.Load(), int32(4), "Setup runs on every new connection")
}

func TestDeclareTopologyIsIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, rabbitmq.DeclareTopology(ch, f.names))
	require.NoError(t, rabbitmq.DeclareTopology(ch, f.names))
}

func TestDialGivesUpWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := rabbitmq.Dial(ctx, rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:1/"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "connection refused")
}

func brokerHostPort(t *testing.T) string {
	u, err := url.Parse(rabbitmqtest.URL())
	require.NoError(t, err)
	return u.Host
}

func proxiedURL(t *testing.T, p *rabbitmqtest.Proxy) string {
	u, err := url.Parse(rabbitmqtest.URL())
	require.NoError(t, err)
	u.Host = p.Addr()
	return u.String()
}

// TestTransientFailureIsRetriedInPlace: a handler whose dependency is down
// for longer than the delivery limit's worth of requeues keeps the delivery
// and retries it; the message is handled once it recovers and never reaches
// the dead-letter queue. Without in-place retries, ten failures would spend
// the five deliveries and dead-letter a good message.
func TestTransientFailureIsRetriedInPlace(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange})
	defer pub.Close()
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_outage")}))

	var calls atomic.Int32
	rec := &recorder{fail: func(d amqp.Delivery) error {
		if calls.Add(1) <= 10 {
			return rabbitmq.Transient(errors.New("database unreachable"))
		}
		return nil
	}}
	runConsumer(t, rabbitmq.NewConsumer(f.conn, rabbitmq.ConsumerConfig{
		Queue: f.names.NotifyQueue, Concurrency: 1, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
	}, rec.handle))
	eventually(t, 10*time.Second, func() bool { return calls.Load() == 11 }, "the handler to succeed after 10 transient failures")

	rec.mu.Lock()
	deliveries := map[bool]int{}
	for _, d := range rec.msgs {
		deliveries[d.Redelivered]++
	}
	rec.mu.Unlock()
	require.Equal(t, map[bool]int{false: 11}, deliveries, "one delivery, handled 11 times in place, never redelivered")
	require.Equal(t, 0, queueDepth(t, f, f.names.NotifyDLQ), "nothing dead-lettered")
	require.Eventually(t, func() bool { return queueDepth(t, f, f.names.NotifyQueue) == 0 }, 5*time.Second, 20*time.Millisecond, "acked")
}

// queueDepth is how many messages queue holds; it must exist.
func queueDepth(t *testing.T, f fixture, queue string) int {
	t.Helper()
	q, ok := inspectQueue(t, f, queue)
	require.True(t, ok, "queue %s exists", queue)
	return q.Messages
}

// inspectQueue reads queue's counts (a passive declare, from a channel of
// its own); ok is false when the queue does not exist (404 NOT_FOUND,
// which also closes that channel).
func inspectQueue(t *testing.T, f fixture, queue string) (q amqp.Queue, ok bool) {
	t.Helper()
	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	q, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return q, err == nil
}
