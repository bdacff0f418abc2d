package rabbitmq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/rabbitmq"
)

// acks records how a delivery was settled.
type acks struct {
	mu    sync.Mutex
	calls []string
}

func (a *acks) record(s string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, s)
	return nil
}

func (a *acks) Ack(uint64, bool) error { return a.record("ack") }
func (a *acks) Reject(_ uint64, requeue bool) error {
	if requeue {
		return a.record("reject requeue")
	}
	return a.record("reject")
}
func (a *acks) Nack(_ uint64, _ bool, requeue bool) error {
	if requeue {
		return a.record("nack requeue")
	}
	return a.record("nack")
}

// TestAFailedMessageCountsTowardTheDeliveryLimit: RabbitMQ 4.3 counts a
// basic.reject toward a quorum queue's delivery limit and not a basic.nack,
// so a failing message requeued with a nack would never be dead-lettered
// there (the broker of docker-compose.yml). A transient failure cut short by
// shutdown is not the message's fault: a nack, which 4.3 does not count.
func TestAFailedMessageCountsTowardTheDeliveryLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		stop bool
		want []string
	}{
		{"success", nil, false, []string{"ack"}},
		{"failure", errors.New("poison"), false, []string{"reject requeue"}},
		{"transient failure at shutdown", rabbitmq.Transient(errors.New("db down")), true, []string{"nack requeue"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := rabbitmq.NewConsumer(nil, rabbitmq.ConsumerConfig{Queue: "q", MinBackoff: time.Millisecond},
				func(context.Context, amqp.Delivery) error { return tt.err })
			ctx, cancel := context.WithCancel(context.Background())
			if tt.stop {
				cancel()
			}
			defer cancel()
			a := &acks{}
			c.Handle(ctx, amqp.Delivery{Acknowledger: a, DeliveryTag: 1, MessageId: "evt_1"})
			require.Equal(t, tt.want, a.calls)
		})
	}
}
