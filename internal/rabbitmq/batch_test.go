package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/rabbitmq"
)

// tagAcks records each settlement with its delivery tag.
type tagAcks struct {
	mu    sync.Mutex
	calls []string
}

func (a *tagAcks) record(format string, args ...any) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, fmt.Sprintf(format, args...))
	return nil
}

func (a *tagAcks) Ack(tag uint64, multiple bool) error {
	return a.record("ack %d multiple=%t", tag, multiple)
}
func (a *tagAcks) Reject(tag uint64, requeue bool) error {
	return a.record("reject %d requeue=%t", tag, requeue)
}
func (a *tagAcks) Nack(tag uint64, multiple, requeue bool) error {
	return a.record("nack %d multiple=%t requeue=%t", tag, multiple, requeue)
}

func (a *tagAcks) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.calls
	a.calls = nil
	return c
}

// TestAcknowledgementNeverCoversADeliveryStillInHand: with several
// handlers, deliveries finish out of order; a multiple acknowledgement is
// sent only for a run of the oldest deliveries that are all settled, so it
// never acknowledges a message whose handler has not returned (its effect
// not yet committed). A failure is rejected at once, on its own, before any
// acknowledgement that spans its tag.
func TestAcknowledgementNeverCoversADeliveryStillInHand(t *testing.T) {
	t.Parallel()
	a := &tagAcks{}
	ds := make([]amqp.Delivery, 7)
	for i := range ds {
		ds[i] = amqp.Delivery{Acknowledger: a, DeliveryTag: uint64(i + 1), MessageId: fmt.Sprint("evt_", i+1)}
	}
	var k rabbitmq.Acker
	k.Track(ds[:3])
	k.Track(ds[3:])
	settle := func(err error, tags ...int) []string {
		var batch []amqp.Delivery
		var errs []error
		for _, tag := range tags {
			batch = append(batch, ds[tag-1])
			errs = append(errs, err)
		}
		require.Empty(t, k.Settle(batch, errs))
		return a.take()
	}
	require.Empty(t, settle(nil, 3), "1 and 2 are still in hand")
	require.Equal(t, []string{"reject 2 requeue=true"}, settle(errors.New("poison"), 2))
	require.Equal(t, []string{"ack 3 multiple=true"}, settle(nil, 1), "1 and 3, around the rejected 2")
	require.Empty(t, settle(nil, 5, 6), "4 is still in hand")
	require.Equal(t, []string{"nack 4 multiple=false requeue=true", "ack 6 multiple=true"},
		settle(rabbitmq.Transient(errors.New("db down")), 4), "a transient failure left at shutdown is nacked")
	require.Equal(t, []string{"ack 7 multiple=false"}, settle(nil, 7), "a single delivery is acknowledged alone")
}

// batchRecorder is a BatchHandler that keeps the batches it was given and
// fails (or panics on) the deliveries named poison.
type batchRecorder struct {
	mu          sync.Mutex
	batches     [][]string
	deliveries  map[string]map[uint64]bool // message id: the delivery tags it came with
	redelivered map[string]bool
	panics      bool
}

func (r *batchRecorder) handle(_ context.Context, ds []amqp.Delivery) []error {
	r.mu.Lock()
	var ids []string
	for _, d := range ds {
		ids = append(ids, d.MessageId)
		if r.deliveries[d.MessageId] == nil {
			r.deliveries[d.MessageId] = map[uint64]bool{}
		}
		r.deliveries[d.MessageId][d.DeliveryTag] = true
		r.redelivered[d.MessageId] = r.redelivered[d.MessageId] || d.Redelivered
	}
	r.batches = append(r.batches, ids)
	r.mu.Unlock()
	errs := make([]error, len(ds))
	for i, d := range ds {
		if d.MessageId == "evt_poison" {
			if r.panics {
				panic("poison")
			}
			errs[i] = errors.New("poison")
		}
	}
	return errs
}

// TestPoisonInABatchIsDeadLetteredAlone: 40 messages wait in the queue, so
// the handler gets them in batches; the one that always fails (by its
// error, or by a panic of its whole batch) reaches the dead-letter queue
// after five deliveries, and every other message of its batches is
// delivered once: never requeued by the poison's failures.
func TestPoisonInABatchIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panics=%t", panics), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange})
			defer pub.Close()
			var msgs []rabbitmq.Message
			for i := range 40 {
				if i == 5 {
					msgs = append(msgs, paid("evt_poison"))
				}
				msgs = append(msgs, paid(fmt.Sprintf("evt_%d", i)))
			}
			for _, err := range pub.Publish(context.Background(), msgs) {
				require.NoError(t, err)
			}

			rec := &batchRecorder{deliveries: map[string]map[uint64]bool{}, redelivered: map[string]bool{}, panics: panics}
			runConsumer(t, rabbitmq.NewBatchConsumer(f.conn, rabbitmq.ConsumerConfig{
				Queue: f.names.NotifyQueue, Prefetch: 64, Concurrency: 2, BatchSize: 8,
				FailureLimit: f.names.DeliveryLimit, DeadLetterQueue: f.names.NotifyDLQ,
			}, rec.handle))
			dlq := &recorder{}
			runConsumer(t, rabbitmq.NewConsumer(f.conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyDLQ}, dlq.handle))
			eventually(t, 10*time.Second, func() bool { return dlq.count() == 1 }, "poison message in the DLQ")
			require.Eventually(t, func() bool { return queueDepth(t, f, f.names.NotifyQueue) == 0 }, 5*time.Second, 20*time.Millisecond, "all acked")

			rec.mu.Lock()
			defer rec.mu.Unlock()
			largest := 0
			for _, b := range rec.batches {
				largest = max(largest, len(b))
			}
			require.Greater(t, largest, 1, "the waiting messages came in batches")
			require.Len(t, rec.deliveries["evt_poison"], 5, "the poison message was delivered five times")
			require.Len(t, rec.deliveries, 41)
			for i := range 40 {
				id := fmt.Sprintf("evt_%d", i)
				require.Len(t, rec.deliveries[id], 1, "%s delivered once", id)
				require.False(t, rec.redelivered[id], "%s never requeued", id)
			}
			require.Equal(t, "evt_poison", dlq.msgs[0].MessageId)
		})
	}
}
