package rabbitmq

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Handle runs one delivery through the consumer's handler and its
// acknowledgement, without a broker.
func (c *Consumer) Handle(ctx context.Context, d amqp.Delivery) {
	c.HandleBatch(ctx, []amqp.Delivery{d})
}

// HandleBatch runs ds, as if just received in this order on a fresh
// channel, through the consumer's handler and their acknowledgements,
// without a broker.
func (c *Consumer) HandleBatch(ctx context.Context, ds []amqp.Delivery) {
	a := &acker{}
	a.track(ds)
	c.handle(ctx, ds, a)
}

// Acker is the acknowledgement bookkeeping of one channel, for tests.
type Acker struct{ a acker }

// Track registers ds as received, in this order.
func (a *Acker) Track(ds []amqp.Delivery) { a.a.track(ds) }

// Settle records the outcome of each of ds and sends what it may.
func (a *Acker) Settle(ds []amqp.Delivery, errs []error) []error { return a.a.settle(ds, errs) }

// LegacyNotifyQueueArgs are the notification queue's arguments before v4.
func LegacyNotifyQueueArgs(n Names) amqp.Table { return legacyNotifyQueueArgs(n) }
