package outbox_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

// BenchmarkRelay measures the relay draining b.N outbox rows: claim with
// FOR UPDATE SKIP LOCKED, publish with confirms, mark published, commit.
// scripts/bench.sh divides its rate by BenchmarkRawPublish's.
func BenchmarkRelay(b *testing.B) {
	db, dbURL := pgtest.NewDB(b)
	names := rabbitmqtest.NewNames(b)
	conn := rabbitmqtest.Dial(b, rabbitmqtest.URL(), func(c *rabbitmq.Config) {
		c.Setup = func(ch *amqp.Channel) error { return rabbitmq.DeclareTopology(ch, names) }
	})
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: names.Exchange})
	defer pub.Close()
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{ListenURL: dbURL, BatchSize: 100})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	data := map[string]any{"id": "ord_x", "email": "buyer@example.com"}
	types := []string{outbox.TypeOrderCreated, outbox.TypeOrderPaid}
	err = postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
		for i := range b.N {
			if err := outbox.Add(ctx, tx, outbox.Event{Type: types[i%2], TenantID: "acme", AggregateID: "ord_x", Data: data, OccurredAt: time.Now()}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for published := 0; published < b.N; {
		n, err := relay.RelayBatch(ctx)
		if err != nil {
			b.Fatal(err)
		}
		published += n
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
