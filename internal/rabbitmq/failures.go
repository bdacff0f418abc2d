package rabbitmq

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Headers the Consumer writes on the copies it publishes of a failed
// message: a copy sent back to its queue for another try, or to the
// dead-letter queue after ConsumerConfig.FailureLimit failures.
const (
	// HeaderFailures counts the handler failures of a message so far
	// (int32). Only a handler's error adds one: a delivery handed back
	// unprocessed (a stop, a crash, a lost channel) never does.
	HeaderFailures = "checkout-failures"
	// HeaderLastError is the last handler error, cut to MaxErrorLen bytes.
	HeaderLastError = "checkout-last-error"
	// HeaderRoutingKey is the routing key the message was first published
	// with (its event type), which a copy sent through the default exchange
	// would otherwise lose.
	HeaderRoutingKey = "checkout-routing-key"
	// HeaderDeadLetteredFrom names the queue whose consumer dead-lettered
	// the message.
	HeaderDeadLetteredFrom = "checkout-dead-lettered-from"
)

// MaxErrorLen bounds HeaderLastError, in bytes.
const MaxErrorLen = 1000

// Failures is the number of handler failures d has had before this
// delivery, from HeaderFailures (0 when absent or not a number).
func Failures(d amqp.Delivery) int {
	switch v := d.Headers[HeaderFailures].(type) {
	case int8:
		return int(v)
	case int16:
		return int(v)
	case int32:
		return int(v)
	case int64:
		return int(v)
	case int:
		return v
	case uint8:
		return int(v)
	case uint16:
		return int(v)
	case uint32:
		return int(v)
	}
	return 0
}

// OriginalRoutingKey is the routing key d was first published with:
// HeaderRoutingKey when a copy carries it, else d's own.
func OriginalRoutingKey(d amqp.Delivery) string {
	if rk, ok := d.Headers[HeaderRoutingKey].(string); ok && rk != "" {
		return rk
	}
	return d.RoutingKey
}

// failureCopy is the message the consumer publishes for d, which failed
// with err for the failures-th time: to the queue itself for another try,
// or to the dead-letter queue once failures reaches the limit. The copy
// keeps d's message id, type, content type, timestamp, body and headers
// (the broker's x-death history aside), so the inbox recognises it.
func (c *Consumer) failureCopy(d amqp.Delivery, err error, failures int) (Message, bool) {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	delete(headers, "x-delivery-count")
	msg := err.Error()
	if len(msg) > MaxErrorLen {
		msg = msg[:MaxErrorLen]
	}
	headers[HeaderFailures] = int32(failures)
	headers[HeaderLastError] = msg
	headers[HeaderRoutingKey] = OriginalRoutingKey(d)
	dead := failures >= c.cfg.FailureLimit
	target := c.cfg.Queue
	if dead {
		target = c.cfg.DeadLetterQueue
		headers[HeaderDeadLetteredFrom] = c.cfg.Queue
	}
	typ := d.Type
	if typ == "" {
		typ = OriginalRoutingKey(d)
	}
	return Message{MessageID: d.MessageId, RoutingKey: target, Type: typ, ContentType: d.ContentType,
		Body: d.Body, Timestamp: d.Timestamp, Headers: headers}, dead
}

// countFailures handles the deliveries of batch whose handler failed for
// the message's sake (errs[i] set and not Transient) when the consumer
// counts failures itself (FailureLimit > 0): each is published again, to
// its queue with one more failure counted, or to the dead-letter queue at
// the limit, with publisher confirms; a confirmed copy clears errs[i], so
// the original is acknowledged. A copy that is not confirmed keeps its
// error, and the original is rejected with requeue as without counting
// (the broker's backstop limit still bounds it). A copy confirmed whose
// original's ack is then lost makes a duplicate, which the handler
// recognises (see package inbox).
//
// The count travels with the message, so it survives any number of
// consumer restarts and needs no store; and a hand-back (a stop, a crash,
// a lost channel) is no failure, on every RabbitMQ version, whatever the
// broker counts.
func (c *Consumer) countFailures(batch []amqp.Delivery, errs []error) {
	if c.retries == nil {
		return
	}
	var idx []int
	var msgs []Message
	var dead []bool
	for i, err := range errs {
		if err == nil || IsTransient(err) {
			continue
		}
		m, d := c.failureCopy(batch[i], err, Failures(batch[i])+1)
		idx, msgs, dead = append(idx, i), append(msgs, m), append(dead, d)
	}
	if len(msgs) == 0 {
		return
	}
	// Detached: a stopping consumer still settles what it handled.
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.HandlerTimeout)
	defer cancel()
	for j, perr := range c.retries.Publish(ctx, msgs) {
		d := batch[idx[j]]
		if perr != nil {
			c.logger.Warn("rabbitmq: could not publish the failed message's copy; requeueing it", "message_id", d.MessageId,
				"err", perr)
			continue
		}
		failures := Failures(d) + 1
		if dead[j] {
			c.logger.Error("rabbitmq: message dead-lettered after failing its handler", "message_id", d.MessageId,
				"failures", failures, "dlq", c.cfg.DeadLetterQueue, "err", errs[idx[j]])
		} else {
			c.logger.Warn("rabbitmq: handler failed; message sent back to its queue", "message_id", d.MessageId,
				"failures", failures, "limit", c.cfg.FailureLimit, "err", errs[idx[j]])
		}
		errs[idx[j]] = nil
	}
}

// checkFailureConfig validates the failure counting of cfg.
func checkFailureConfig(cfg ConsumerConfig) error {
	if cfg.FailureLimit > 0 && cfg.DeadLetterQueue == "" {
		return fmt.Errorf("rabbitmq: consumer of %s: FailureLimit set without DeadLetterQueue", cfg.Queue)
	}
	return nil
}

// retryConfirmTimeout bounds the confirm of a failed message's copy.
const retryConfirmTimeout = 5 * time.Second
