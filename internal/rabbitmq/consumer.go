package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Handler processes one delivery. It must be safe for concurrent use.
//
// Returning nil acknowledges the message: the broker forgets it, so the
// handler must have made its effect durable first (commit, then return).
// Returning an error nacks it with requeue: the broker delivers it again,
// maybe to another consumer, maybe after later messages. A queue with a
// delivery limit dead-letters it after the limit. Handlers must therefore be
// idempotent (see package inbox). ctx is not cancelled when the consumer
// stops taking work, only when the drain deadline passes.
type Handler func(ctx context.Context, d amqp.Delivery) error

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Queue is consumed; it must exist (see DeclareTopology).
	Queue string
	// Tag names the consumer on the broker (optional).
	Tag string
	// Prefetch is how many unacknowledged messages the broker sends ahead
	// (basic.qos; default 32).
	Prefetch int
	// Concurrency is how many handlers run at once (default 4).
	Concurrency int
	// HandlerTimeout bounds one handler call, including during shutdown
	// (default 20s).
	HandlerTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between resubscriptions after
	// a channel or connection loss (defaults 100ms and 5s).
	MinBackoff, MaxBackoff time.Duration
	// Logger receives losses and handler errors (default: discard).
	Logger *slog.Logger
}

// Consumer consumes one queue with manual acknowledgements and a prefetch
// window, resubscribing after any channel or connection loss.
//
// Delivery is at least once and unordered: a message unacknowledged when a
// channel dies is delivered again, and with Concurrency > 1 handlers finish
// in any order.
type Consumer struct {
	conn    *Conn
	cfg     ConsumerConfig
	handler Handler
	logger  *slog.Logger
}

// NewConsumer returns a Consumer of cfg.Queue that passes each delivery to h.
func NewConsumer(conn *Conn, cfg ConsumerConfig, h Handler) *Consumer {
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 32
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.HandlerTimeout <= 0 {
		cfg.HandlerTimeout = 20 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Consumer{conn: conn, cfg: cfg, handler: h, logger: logger.With("queue", cfg.Queue)}
}

// Run consumes until ctx ends, then stops taking deliveries, lets the
// handlers in flight finish and acknowledge (each within HandlerTimeout),
// and returns nil. Deliveries prefetched but not started are returned to the
// queue when the channel closes. Run returns an error only if the Conn was
// closed under it.
func (c *Consumer) Run(ctx context.Context) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = c.cfg.MinBackoff
	b.MaxInterval = c.cfg.MaxBackoff
	for {
		started := time.Now()
		err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrClosed) {
			return err
		}
		if time.Since(started) > time.Minute {
			b.Reset() // a long healthy session earns a fast retry
		}
		wait := b.NextBackOff()
		c.logger.Warn("rabbitmq: consumer interrupted, resubscribing", "err", err, "in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
	}
}

// session subscribes once and processes deliveries until the channel dies
// or ctx ends.
func (c *Consumer) session(ctx context.Context) error {
	ch, err := c.conn.Channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("qos: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := ch.Consume(c.cfg.Queue, c.cfg.Tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.cfg.Queue, err)
	}

	// stop ends the workers' intake; they finish the message in hand.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range c.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case d, ok := <-deliveries:
					if !ok {
						return // channel or connection gone
					}
					c.handle(ctx, d)
				}
			}
		}()
	}

	var result error
	select {
	case <-ctx.Done():
	case cerr := <-closed:
		result = errors.New("channel closed")
		if cerr != nil {
			result = cerr
		}
	}
	close(stop)
	wg.Wait()
	return result
}

// Transient marks a handler error as a passing condition of the consumer's
// own dependencies (its database is unreachable), not of the message. The
// Consumer then retries the handler in place with backoff, keeping the
// delivery unacknowledged, instead of requeueing it: every requeue counts
// toward the queue's delivery limit, and an outage of a few seconds would
// otherwise dead-letter good messages.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err}
}

type transientError struct{ err error }

func (e *transientError) Error() string { return "transient: " + e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// IsTransient reports whether err was marked with Transient.
func IsTransient(err error) bool {
	var t *transientError
	return errors.As(err, &t)
}

// handle runs the handler on a context that survives ctx's cancellation, so
// shutdown finishes the message instead of abandoning a half-done effect,
// then acks or requeues. A Transient error is retried in place (backoff up to
// MaxBackoff) until the handler succeeds, fails for good, or the consumer
// stops.
//
// A message that failed is requeued with basic.reject: a failed delivery,
// counted toward the queue's delivery limit on every RabbitMQ version. One
// still failing transiently when the consumer stops is requeued with
// basic.nack: from RabbitMQ 4.3 on, a nack is a return that does not count
// (before 4.3 both count, so a nack there would dead-letter after the limit
// as well, and 4.3 with a nack never would).
func (c *Consumer) handle(ctx context.Context, d amqp.Delivery) {
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = c.cfg.MinBackoff
	retry.MaxInterval = c.cfg.MaxBackoff
	var err error
	for {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HandlerTimeout)
		err = c.callHandler(hctx, d)
		cancel()
		if !IsTransient(err) || ctx.Err() != nil {
			break
		}
		wait := retry.NextBackOff()
		c.logger.Warn("rabbitmq: handler failed transiently, retrying in place", "message_id", d.MessageId, "in", wait, "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
	if err != nil {
		c.logger.Warn("rabbitmq: handler failed, requeueing", "message_id", d.MessageId,
			"redelivered", d.Redelivered, "delivery_count", d.Headers["x-delivery-count"], "err", err)
		var rerr error
		if IsTransient(err) {
			rerr = d.Nack(false, true)
		} else {
			rerr = d.Reject(true)
		}
		if rerr != nil {
			// The channel is gone: the broker requeues the message itself.
			c.logger.Warn("rabbitmq: requeue failed", "message_id", d.MessageId, "err", rerr)
		}
		return
	}
	if aerr := d.Ack(false); aerr != nil {
		// The effect is committed; the redelivery will be a duplicate that
		// the handler recognises.
		c.logger.Warn("rabbitmq: ack failed", "message_id", d.MessageId, "err", aerr)
	}
}

// callHandler turns a handler panic into an error, so one bad message cannot
// take down the process; it goes to the dead-letter queue instead.
func (c *Consumer) callHandler(ctx context.Context, d amqp.Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v", r)
		}
	}()
	return c.handler(ctx, d)
}
