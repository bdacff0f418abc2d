package rabbitmq

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Handle runs one delivery through the consumer's handler and its
// acknowledgement, without a broker.
func (c *Consumer) Handle(ctx context.Context, d amqp.Delivery) { c.handle(ctx, d) }
