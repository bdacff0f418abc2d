package rabbitmq

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology declares the checkout topology on a Conn's connections and
// migrates what older versions declared otherwise. Its Prepare and Declare
// are Config.Prepare and Config.Setup (daemon.Deps.Open wires them).
type Topology struct {
	names  Names
	logger *slog.Logger
	// legacy is set while NotifyQueue is the one an older version declared
	// (see MigrateNotifyQueue), so that Declare redeclares it as it is.
	legacy atomic.Bool
}

// NewTopology returns the Topology of n; logger may be nil.
func NewTopology(n Names, logger *slog.Logger) *Topology {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Topology{names: n, logger: logger}
}

// Prepare is Config.Prepare: MigrateDLQ, then MigrateNotifyQueue.
func (t *Topology) Prepare(conn *amqp.Connection) error {
	if err := MigrateDLQ(conn, t.names, t.logger); err != nil {
		return err
	}
	legacy, err := MigrateNotifyQueue(conn, t.names, t.logger)
	if err != nil {
		return err
	}
	t.legacy.Store(legacy)
	return nil
}

// Declare is Config.Setup: DeclareTopology, with NotifyQueue's arguments
// as an older version declared them while Prepare found it could not
// replace that queue yet.
//
// The queue can change under a live connection: another process replaces
// the older queue once it is empty and unused (MigrateNotifyQueue). A
// declaration refused for its arguments therefore switches to the other
// ones before it returns its error, so the caller's retry (the Consumer's
// next session, the Publisher's next send) declares what the queue is.
func (t *Topology) Declare(ch *amqp.Channel) error {
	legacy := t.legacy.Load()
	err := declareTopology(ch, t.names, legacy)
	if errors.Is(err, errNotifyQueueArgs) && t.legacy.CompareAndSwap(legacy, !legacy) {
		t.logger.Warn("rabbitmq: the notification queue's arguments changed under this process; declaring the other ones next",
			"queue", t.names.NotifyQueue, "older_version_queue", !legacy)
	}
	return err
}

// Legacy reports whether NotifyQueue is still the queue of an older
// version, whose broker-side limit counts hand-backs (see
// MigrateNotifyQueue).
func (t *Topology) Legacy() bool { return t.legacy.Load() }

// legacyNotifyQueueArgs are NotifyQueue's arguments as versions before
// CONTRACT.md v4 declared them: the broker counted every return toward
// DeliveryLimit deliveries.
func legacyNotifyQueueArgs(n Names) amqp.Table {
	return amqp.Table{
		amqp.QueueTypeArg:           amqp.QueueTypeQuorum,
		"x-delivery-limit":          int32(n.DeliveryLimit - 1),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": n.NotifyDLQ,
		"x-dead-letter-strategy":    "at-most-once",
	}
}

// MigrateNotifyQueue gives NotifyQueue the arguments of this version
// (notifyQueueArgs: the broker-side limit is BackstopLimit) on the broker
// conn is connected to. RabbitMQ cannot change the arguments of an
// existing queue (a declare with others fails with PRECONDITION_FAILED and
// closes its channel), and a delivery-limit policy cannot raise a limit
// set as an argument (the lower one applies), so the queue of an older
// version, whose limit of DeliveryLimit-1 returns counts hand-backs, must be
// deleted and declared again. MigrateNotifyQueue opens channels of its own;
// run it before DeclareTopology, as Topology.Prepare.
//
//   - The queue exists with this version's arguments, or does not exist: it
//     is declared; legacy is false.
//   - It exists with other arguments, empty and without consumers: it is
//     unbound, so that no event reaches it any more (the dispatcher's
//     publishes come back unroutable and are retried), found still empty,
//     then deleted and declared again (DeclareTopology binds it); legacy is
//     false. A quorum queue cannot be deleted "if empty" (RabbitMQ refuses
//     the flag and closes the connection), hence the unbinding first.
//   - It holds messages or has consumers (workers of the older version are
//     still running): nothing is deleted and legacy is true, so that the
//     caller keeps declaring it as it is (Topology.Declare). Everything
//     works as before the migration, restarts may dead-letter healthy
//     events (they are recorded, alerted on and sent again by `worker
//     redrive-dead-letters`), and the next process that connects when the
//     queue is empty and unused replaces it (docs/DEAD_LETTERS.md, "Upgrade").
func MigrateNotifyQueue(conn *amqp.Connection, n Names, logger *slog.Logger) (legacy bool, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	err = declareNotifyQueue(ch, n, notifyQueueArgs(n))
	if err == nil {
		return false, ch.Close()
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return false, err
	}
	// ch is closed by the refusal: the queue exists with other arguments.
	ch, err = conn.Channel()
	if err != nil {
		return false, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(n.NotifyQueue, true, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("inspect queue %s: %w", n.NotifyQueue, err)
	}
	if q.Messages == 0 && q.Consumers == 0 {
		replaced, err := replaceEmpty(ch, n)
		if err != nil {
			return false, err
		}
		if replaced {
			logger.Warn("rabbitmq: replaced the notification queue of an older version (its delivery limit counted restarts)",
				"queue", n.NotifyQueue, "backstop_limit", n.BackstopLimit)
			return false, nil
		}
	}
	if err := declareNotifyQueue(ch, n, legacyNotifyQueueArgs(n)); err != nil {
		return false, fmt.Errorf("queue %s has arguments neither of this version nor of the last (%v): %w", n.NotifyQueue, ae.Reason, err)
	}
	logger.Warn("rabbitmq: the notification queue is an older version's, whose delivery limit counts restarts; "+
		"it is replaced once it is empty and unused (docs/DEAD_LETTERS.md, \"Upgrade\")",
		"queue", n.NotifyQueue, "messages", q.Messages, "consumers", q.Consumers)
	return true, nil
}

// replaceEmpty replaces NotifyQueue, found empty and unused, with one of
// this version's arguments, on ch: it unbinds it, checks that it is still
// empty and unused, deletes it and declares it. It reports false, with the
// bindings restored, when the queue took a message or a consumer meanwhile.
func replaceEmpty(ch *amqp.Channel, n Names) (bool, error) {
	// Unbinding from a missing exchange would fail: declare it first.
	if err := ch.ExchangeDeclare(n.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return false, fmt.Errorf("declare exchange %s: %w", n.Exchange, err)
	}
	for _, key := range n.NotifyBindings {
		if err := ch.QueueUnbind(n.NotifyQueue, key, n.Exchange, nil); err != nil {
			return false, fmt.Errorf("unbind %s from %s: %w", n.NotifyQueue, n.Exchange, err)
		}
	}
	q, err := ch.QueueDeclarePassive(n.NotifyQueue, true, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("inspect queue %s: %w", n.NotifyQueue, err)
	}
	if q.Messages > 0 || q.Consumers > 0 {
		for _, key := range n.NotifyBindings {
			if err := ch.QueueBind(n.NotifyQueue, key, n.Exchange, false, nil); err != nil {
				return false, fmt.Errorf("bind %s to %s again: %w", n.NotifyQueue, n.Exchange, err)
			}
		}
		return false, nil
	}
	if _, err := ch.QueueDelete(n.NotifyQueue, false, false, false); err != nil {
		return false, fmt.Errorf("delete the older queue %s: %w", n.NotifyQueue, err)
	}
	return true, declareNotifyQueue(ch, n, notifyQueueArgs(n))
}
