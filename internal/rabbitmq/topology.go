package rabbitmq

import (
	"errors"
	"fmt"
	"log/slog"

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
	// DeliveryLimit times ("notify.order_paid.dlq"). It is a quorum queue,
	// replicated like NotifyQueue; before v3 it was a classic queue, which
	// MigrateDLQ replaces.
	NotifyDLQ string
	// DeliveryLimit is how many times the worker's handler may fail a
	// message of NotifyQueue before it is dead-lettered (5; CONTRACT.md,
	// "Events"). The consumer counts these failures itself
	// (ConsumerConfig.FailureLimit), so that deliveries handed back by a
	// stopping or crashing consumer never count.
	DeliveryLimit int
	// BackstopLimit is NotifyQueue's broker-side x-delivery-limit (100): the
	// returns after which RabbitMQ dead-letters a message by itself. It
	// only ends a loop the consumer cannot count, a message that kills the
	// process before its handler returns; every RabbitMQ before 4.3 also
	// counts hand-backs toward it, so it is far above what restarts reach.
	BackstopLimit int
}

// DeadLetterQueueOf is the name of queue's dead-letter queue: queue +
// ".dlq" ("notify.order_paid.dlq").
func DeadLetterQueueOf(queue string) string { return queue + ".dlq" }

// DefaultNames returns the topology of CONTRACT.md, "Events".
func DefaultNames() Names {
	return Names{
		Exchange:       "checkout.events",
		NotifyQueue:    "notify.order_paid",
		NotifyBindings: []string{"order.paid", "order.*"},
		NotifyDLQ:      DeadLetterQueueOf("notify.order_paid"),
		DeliveryLimit:  5,
		BackstopLimit:  100,
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
// dead-letter queue and the notification queue bound with its binding keys,
// both queues quorum queues (replicated on a cluster's nodes). The
// dispatcher and the worker both call it at start (and on every reconnect),
// so no event is lost whichever starts first.
//
// NotifyQueue is a quorum queue. Its consumer counts handler failures and
// dead-letters after DeliveryLimit of them (ConsumerConfig.FailureLimit):
// RabbitMQ cannot be left to count, since before 4.3 every return counts,
// a delivery handed back by a stopping consumer too (so restarts with a
// backlog dead-lettered healthy events), and 4.x applies a limit of 20 to
// a quorum queue declared without one. The queue's x-delivery-limit is
// therefore BackstopLimit, only a guard against a message that kills its
// consumer, dead-lettering through the default exchange to NotifyDLQ as
// the consumer does.
//
// Queue arguments cannot change on an existing queue, nor can a policy
// raise a delivery limit set as an argument (RabbitMQ takes the lower of
// the two): NotifyQueue declared by an older version with a limit of
// DeliveryLimit-1 is replaced by MigrateNotifyQueue.
//
// Declaring an existing queue with other arguments fails with
// PRECONDITION_FAILED, and closes ch: a classic NotifyDLQ left by an older
// version does, which MigrateDLQ (run first, as Config.Prepare) replaces.
func DeclareTopology(ch *amqp.Channel, n Names) error {
	return declareTopology(ch, n, false)
}

// declareTopology is DeclareTopology, declaring NotifyQueue with an older
// version's arguments if legacy (see MigrateNotifyQueue).
func declareTopology(ch *amqp.Channel, n Names, legacy bool) error {
	if n.DeliveryLimit <= 0 {
		return fmt.Errorf("rabbitmq: delivery limit must be positive, got %d", n.DeliveryLimit)
	}
	if n.BackstopLimit < n.DeliveryLimit {
		return fmt.Errorf("rabbitmq: backstop limit %d is below the delivery limit %d", n.BackstopLimit, n.DeliveryLimit)
	}
	if err := ch.ExchangeDeclare(n.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", n.Exchange, err)
	}
	if err := declareDLQ(ch, n); err != nil {
		return err
	}
	args := notifyQueueArgs(n)
	if legacy {
		args = legacyNotifyQueueArgs(n)
	}
	if err := declareNotifyQueue(ch, n, args); err != nil {
		return err
	}
	for _, key := range n.NotifyBindings {
		if err := ch.QueueBind(n.NotifyQueue, key, n.Exchange, false, nil); err != nil {
			return fmt.Errorf("bind %s to %s with %s: %w", n.NotifyQueue, n.Exchange, key, err)
		}
	}
	return nil
}

// notifyQueueArgs are NotifyQueue's arguments.
func notifyQueueArgs(n Names) amqp.Table {
	return amqp.Table{
		amqp.QueueTypeArg: amqp.QueueTypeQuorum,
		// x-delivery-limit counts returns: a message is dead-lettered when
		// returned more than the limit.
		"x-delivery-limit":          int32(n.BackstopLimit),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": n.NotifyDLQ,
		// The queue keeps a message it dead-letters until the DLQ has
		// confirmed it, so none is lost in between; RabbitMQ requires the
		// reject-publish overflow for that (without a length limit it
		// refuses nothing). https://www.rabbitmq.com/docs/quorum-queues#dead-lettering
		"x-dead-letter-strategy": "at-least-once",
		"x-overflow":             "reject-publish",
	}
}

// declareNotifyQueue declares NotifyQueue with args. A refusal because the
// queue exists with other arguments wraps errNotifyQueueArgs.
func declareNotifyQueue(ch *amqp.Channel, n Names, args amqp.Table) error {
	if _, err := ch.QueueDeclare(n.NotifyQueue, true, false, false, false, args); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			return fmt.Errorf("declare queue %s: %w: %w", n.NotifyQueue, errNotifyQueueArgs, err)
		}
		return fmt.Errorf("declare queue %s: %w", n.NotifyQueue, err)
	}
	return nil
}

// errNotifyQueueArgs: NotifyQueue exists with other arguments than those
// declared (PRECONDITION_FAILED).
var errNotifyQueueArgs = errors.New("the notification queue exists with other arguments")

// declareDLQ declares NotifyDLQ, a durable quorum queue. It is the target
// of NotifyQueue's dead-lettering, at most once: a quorum queue keeps the
// poison messages an operator must look at when a node dies, which a
// classic queue, on one node only, does not (RabbitMQ 4 removed classic
// queue mirroring).
func declareDLQ(ch *amqp.Channel, n Names) error {
	if _, err := ch.QueueDeclare(n.NotifyDLQ, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg: amqp.QueueTypeQuorum,
	}); err != nil {
		return fmt.Errorf("declare queue %s: %w", n.NotifyDLQ, err)
	}
	return nil
}

// MigrateDLQ makes n.NotifyDLQ a quorum queue on the broker conn is
// connected to, for a broker where an older version declared it a classic
// queue (RabbitMQ refuses to redeclare a queue with another type, with
// PRECONDITION_FAILED). It opens channels of its own, since a refused
// declare closes its channel. Run it before DeclareTopology, as
// Config.Prepare.
//
//   - The quorum DLQ exists, or no DLQ does: it is declared; nothing else.
//   - A classic DLQ exists and is empty: it is deleted (only if still empty,
//     the broker checks) and declared again as a quorum queue. A message
//     dead-lettered in the instant between is dropped, as when the DLQ is
//     missing (the notification queue dead-letters at most once).
//   - A classic DLQ holds messages: they are poison events an operator must
//     look at, so nothing is moved or deleted and the error wraps
//     ErrPermanent, naming the queue and its count (README, "Running in
//     production", says how to move them aside).
func MigrateDLQ(conn *amqp.Connection, n Names, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	err = declareDLQ(ch, n)
	if err == nil {
		return ch.Close()
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return err
	}
	// ch is closed by the refusal: the DLQ exists with other arguments.
	ch, err = conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	q, perr := ch.QueueDeclarePassive(n.NotifyDLQ, true, false, false, false, nil)
	if perr != nil {
		return fmt.Errorf("inspect queue %s: %w", n.NotifyDLQ, perr)
	}
	if q.Messages > 0 {
		return fmt.Errorf("%w: dead-letter queue %s is not a quorum queue (%v) and holds %d messages: "+
			"move them aside and delete it (README, \"Running in production\"), then restart",
			ErrPermanent, n.NotifyDLQ, ae.Reason, q.Messages)
	}
	if _, err := ch.QueueDelete(n.NotifyDLQ, false, true, false); err != nil {
		return fmt.Errorf("delete empty classic queue %s: %w", n.NotifyDLQ, err)
	}
	if err := declareDLQ(ch, n); err != nil {
		return err
	}
	logger.Warn("rabbitmq: replaced the empty classic dead-letter queue with a quorum queue", "queue", n.NotifyDLQ)
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
