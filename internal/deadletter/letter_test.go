package deadletter

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/rabbitmq"
)

// TestLetterOfReadsBothWaysIn: a message the consumer dead-lettered
// carries its own headers; one RabbitMQ moved past the backstop limit
// carries x-death (https://www.rabbitmq.com/docs/dlx#effects), the newest
// death first; one with neither is still recorded, against the DLQ.
func TestLetterOfReadsBothWaysIn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		d    amqp.Delivery
		want Letter
	}{
		{"by the consumer", amqp.Delivery{MessageId: "evt_1", RoutingKey: "q.dlq", Type: "order.paid", Body: []byte("{}"),
			Headers: amqp.Table{rabbitmq.HeaderDeadLetteredFrom: "q", rabbitmq.HeaderFailures: int32(5),
				rabbitmq.HeaderLastError: "boom", rabbitmq.HeaderRoutingKey: "order.paid"}},
			Letter{Queue: "q", MessageID: "evt_1", RoutingKey: "order.paid", Reason: ReasonHandlerFailed, LastError: "boom", Failures: 5}},
		{"by the broker's backstop", amqp.Delivery{MessageId: "evt_2", RoutingKey: "q.dlq", Type: "order.refunded", Body: []byte("{}"),
			Headers: amqp.Table{"x-death": []any{
				amqp.Table{"queue": "q", "reason": "delivery_limit", "count": int64(1), "routing-keys": []any{"order.refunded"}},
				amqp.Table{"queue": "other", "reason": "expired"},
			}}},
			Letter{Queue: "q", MessageID: "evt_2", RoutingKey: "order.refunded", Reason: ReasonDeliveryLimit}},
		{"without history", amqp.Delivery{MessageId: "evt_3", RoutingKey: "q.dlq", Type: "order.paid", Body: []byte("{}")},
			Letter{Queue: "q.dlq", MessageID: "evt_3", RoutingKey: "order.paid", Reason: ReasonUnknown}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := letterOf(tt.d, "q.dlq")
			got.Headers, got.Body, got.ContentType = nil, nil, ""
			require.Equal(t, tt.want, got)
		})
	}
}
