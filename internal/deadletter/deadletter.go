// Package deadletter keeps the events a consumer gave up on (CONTRACT.md
// v4, "Events"): it owns the dead_letters table, consumes the dead-letter
// queue into it (Recorder), counts what it holds in /metrics, and sends
// recorded events through their queue again (Redrive).
//
// A message reaches the dead-letter queue two ways: the worker's consumer
// publishes it there after rabbitmq.Names.DeliveryLimit handler failures,
// with its last error (reason handler_failed), or RabbitMQ moves it there
// by itself past the queue's backstop limit (reason delivery_limit) or for
// another broker reason (x-death). Either way the Recorder writes it down
// before it acknowledges it, so an event is never dead-lettered unrecorded.
package deadletter

import (
	"time"
)

// Reason is why a message was dead-lettered.
type Reason string

// Reasons of dead_letters.reason and of checkout_dead_letters_total.
const (
	// ReasonHandlerFailed: the consumer's handler failed the message
	// rabbitmq.Names.DeliveryLimit times (rabbitmq.ConsumerConfig.FailureLimit).
	ReasonHandlerFailed Reason = "handler_failed"
	// ReasonDeliveryLimit: RabbitMQ's backstop x-delivery-limit (returns
	// the consumer could not count, such as a process killed by a message).
	ReasonDeliveryLimit Reason = "delivery_limit"
	// ReasonRejected: a consumer rejected it without requeue.
	ReasonRejected Reason = "rejected"
	// ReasonExpired: its TTL passed.
	ReasonExpired Reason = "expired"
	// ReasonMaxLen: the queue was over its length limit.
	ReasonMaxLen Reason = "maxlen"
	// ReasonUnknown: it carries no dead-lettering history (published to the
	// dead-letter queue by hand).
	ReasonUnknown Reason = "unknown"
)

// Reasons lists every Reason.
var Reasons = []Reason{ReasonHandlerFailed, ReasonDeliveryLimit, ReasonRejected, ReasonExpired, ReasonMaxLen, ReasonUnknown}

// reasonOf maps RabbitMQ's x-death reason (https://www.rabbitmq.com/docs/dlx#effects)
// to a Reason.
func reasonOf(broker string) Reason {
	for _, r := range Reasons {
		if string(r) == broker && r != ReasonHandlerFailed && r != ReasonUnknown {
			return r
		}
	}
	return ReasonUnknown
}

// Letter is one recorded dead letter: a row of dead_letters.
type Letter struct {
	// ID is the row's id ("dlt_...").
	ID string
	// Queue is the queue the message was dead-lettered from, which Redrive
	// sends it to.
	Queue string
	// MessageID is the AMQP message_id: the outbox event id.
	MessageID string
	// RoutingKey is the routing key it was first published with, its
	// event type.
	RoutingKey string
	// ContentType is its AMQP content_type.
	ContentType string
	// Reason is why it was dead-lettered.
	Reason Reason
	// LastError is the handler's last error (ReasonHandlerFailed), or "".
	LastError string
	// Failures is how many times the handler had failed it.
	Failures int
	// Times is how many dead-letterings were recorded while unresolved.
	Times int
	// Headers are its AMQP headers as JSON.
	Headers []byte
	// Body is its body, byte for byte.
	Body []byte
	// FirstDeadAt and LastDeadAt are when it was first and last recorded.
	FirstDeadAt, LastDeadAt time.Time
	// RedrivenAt is when Redrive sent it again; nil while unresolved.
	RedrivenAt *time.Time
}
