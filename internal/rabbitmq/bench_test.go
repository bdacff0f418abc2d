package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

// BenchmarkRawPublish is the machine's limit for the outbox relay: persistent
// messages published straight with amqp091-go to the same topology, in
// batches of 100 with publisher confirms, no database involved.
// scripts/bench.sh divides the relay's rate by it.
func BenchmarkRawPublish(b *testing.B) {
	names := rabbitmqtest.NewNames(b)
	conn, err := amqp.Dial(rabbitmqtest.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	body := []byte(`{"id":"evt_x","type":"order.paid","data":{"id":"ord_x","email":"buyer@example.com"}}`)
	keys := []string{"order.created", "order.paid"} // the relay's mix: half reach the queue
	const batch = 100
	b.ResetTimer()
	for sent := 0; sent < b.N; {
		n := min(batch, b.N-sent)
		confirms := make([]*amqp.DeferredConfirmation, n)
		for i := range n {
			confirms[i], err = ch.PublishWithDeferredConfirmWithContext(ctx, names.Exchange, keys[(sent+i)%2], false, false,
				amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: "m", Body: body, Timestamp: time.Now()})
			if err != nil {
				b.Fatal(err)
			}
		}
		for _, c := range confirms {
			if ok, err := c.WaitContext(ctx); err != nil || !ok {
				b.Fatalf("confirm: %v %v", ok, err)
			}
		}
		sent += n
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
