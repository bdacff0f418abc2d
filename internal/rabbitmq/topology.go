package rabbitmq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Names are the exchange and queues of the checkout topology. Production uses
// DefaultNames; tests use unique names so that they share a broker safely.
type Names struct {
	// Exchange is the durable topic exchange events are published to
	// ("checkout.events").
	Exchange string
	// NotifyQueue is the durable queue of the notification worker
	// ("notify.order_paid"), bound with NotifyBindings.
	NotifyQueue string
	// NotifyBindings are the binding keys of NotifyQueue (["order.paid",
	// "order.*"]): the contract's binding, and every other event of an
	// order. RabbitMQ routes a message to a queue once however many of its
	// bindings match it, so an order.paid is not delivered twice.
	//
	// The worker takes every event of an order, not only the ones it
	// emails about (order.paid, order.refunded): it applies an order's
	// events in their sequence (outbox.Event.Sequence), and a consumer can
	// only tell that an event is early, its predecessor not yet applied, if
	// every predecessor reaches it too. One queue for all of them keeps one
	// delivery limit, one dead-letter queue and one consumer to operate;
	// the events it does not email about cost an inbox row each.
	NotifyBindings []string
	// NotifyDLQ receives the messages of NotifyQueue that failed
	// DeliveryLimit times ("notify.order_paid.dlq").
	NotifyDLQ string
	// DeliveryLimit is how many times a message of NotifyQueue is delivered
	// before it is dead-lettered (5).
	DeliveryLimit int
}

// DefaultNames returns the topology of CONTRACT.md, "Events".
func DefaultNames() Names {
	return Names{
		Exchange:       "checkout.events",
		NotifyQueue:    "notify.order_paid",
		NotifyBindings: []string{"order.paid", "order.*"},
		NotifyDLQ:      "notify.order_paid.dlq",
		DeliveryLimit:  5,
	}
}

// WithPrefix returns n with every exchange and queue name prefixed, so that
// several copies of the topology can share one broker (tests).
func (n Names) WithPrefix(prefix string) Names {
	n.Exchange = prefix + n.Exchange
	n.NotifyQueue = prefix + n.NotifyQueue
	n.NotifyDLQ = prefix + n.NotifyDLQ
	return n
}

// DeclareTopology declares, idempotently, the durable topic exchange, the
// dead-letter queue and the notification queue bound with its binding keys. The
// dispatcher and the worker both call it at start (and on every reconnect),
// so no event is lost whichever starts first.
//
// NotifyQueue is a quorum queue: RabbitMQ counts its deliveries itself
// (x-delivery-count) and, once a message has been returned DeliveryLimit-1
// times, dead-letters the next return through the default exchange to
// NotifyDLQ. A consumer therefore only nacks with requeue and never counts.
// Note that a delivery also counts when the consumer's channel dies with the
// message unacked.
//
// Declaring an existing queue with other arguments fails with
// PRECONDITION_FAILED, and closes ch.
func DeclareTopology(ch *amqp.Channel, n Names) error {
	if n.DeliveryLimit <= 0 {
		return fmt.Errorf("rabbitmq: delivery limit must be positive, got %d", n.DeliveryLimit)
	}
	if err := ch.ExchangeDeclare(n.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", n.Exchange, err)
	}
	if _, err := ch.QueueDeclare(n.NotifyDLQ, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg: amqp.QueueTypeClassic,
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", n.NotifyDLQ, err)
	}
	if _, err := ch.QueueDeclare(n.NotifyQueue, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg: amqp.QueueTypeQuorum,
		// x-delivery-limit counts returns, not deliveries: a message is
		// dead-lettered when returned more than the limit, so limit-1 returns
		// allow exactly DeliveryLimit deliveries.
		"x-delivery-limit":          int32(n.DeliveryLimit - 1),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": n.NotifyDLQ,
		"x-dead-letter-strategy":    "at-most-once",
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", n.NotifyQueue, err)
	}
	for _, key := range n.NotifyBindings {
		if err := ch.QueueBind(n.NotifyQueue, key, n.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind %s to %s with %s: %w", n.NotifyQueue, n.Exchange, key, err)
		}
	}
	return nil
}

// DeleteTopology deletes the exchange and both queues of n, with whatever
// messages they hold. Tests call it in t.Cleanup.
func DeleteTopology(ch *amqp.Channel, n Names) error {
	if _, err := ch.QueueDelete(n.NotifyQueue, false, false, false); err != nil {
		return fmt.Errorf("delete queue %s: %w", n.NotifyQueue, err)
	}
	if _, err := ch.QueueDelete(n.NotifyDLQ, false, false, false); err != nil {
		return fmt.Errorf("delete queue %s: %w", n.NotifyDLQ, err)
	}
	if err := ch.ExchangeDelete(n.Exchange, false, false); err != nil {
		return fmt.Errorf("delete exchange %s: %w", n.Exchange, err)
	}
	return nil
}
