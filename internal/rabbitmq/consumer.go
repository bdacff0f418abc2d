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
// Returning an error fails it: a consumer that counts failures
// (ConsumerConfig.FailureLimit) publishes it again with one more failure
// counted, or to the dead-letter queue at the limit, then acknowledges it;
// one that does not rejects it with requeue. Either way it comes again,
// maybe to another consumer, maybe after later messages. Handlers must
// therefore be idempotent (see package inbox). ctx is not cancelled when the consumer
// stops taking work, only when the drain deadline passes.
type Handler func(ctx context.Context, d amqp.Delivery) error

// BatchHandler processes several deliveries at once (up to
// ConsumerConfig.BatchSize, in delivery order) and returns one error per
// delivery, in the same order, with Handler's meaning for each: nil
// acknowledges that delivery, so its effect must be durable first; an error
// requeues it (a Transient one is retried in place). A handler that makes
// the effects of a batch durable together (one transaction) must still fail
// only the deliveries at fault, so that a poison message does not spend the
// delivery limit of the healthy ones beside it. It must be safe for
// concurrent use.
type BatchHandler func(ctx context.Context, ds []amqp.Delivery) []error

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Queue is consumed; it must exist (see DeclareTopology), or be
	// declared by the Conn's Setup, which every session runs first.
	Queue string
	// Tag names the consumer on the broker (optional).
	Tag string
	// Prefetch is how many unacknowledged messages the broker sends ahead
	// (basic.qos; default 32).
	Prefetch int
	// Concurrency is how many handlers run at once (default 4).
	Concurrency int
	// BatchSize is the most deliveries one BatchHandler call gets (default
	// 1; a Handler always gets one). A handler takes the deliveries the
	// broker has already sent, waiting only for the first.
	BatchSize int
	// HandlerTimeout bounds one handler call, including during shutdown
	// (default 20s).
	HandlerTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between resubscriptions after
	// a channel or connection loss or a cancel (defaults 100ms and 5s).
	MinBackoff, MaxBackoff time.Duration
	// FailureLimit is how many times the handler may fail a message (an
	// error not marked Transient) before the consumer dead-letters it by
	// publishing it to DeadLetterQueue (0: the consumer counts nothing and
	// rejects a failed message with requeue, leaving any limit to the
	// broker). Only handler failures count: a delivery handed back
	// unprocessed by a stop, a crash or a lost channel never does, whatever
	// the broker version (see countFailures).
	FailureLimit int
	// DeadLetterQueue receives, through the default exchange, the messages
	// that failed FailureLimit times; required with FailureLimit.
	DeadLetterQueue string
	// Logger receives losses and handler errors (default: discard).
	Logger *slog.Logger
}

// Consumer consumes one queue with manual acknowledgements and a prefetch
// window, resubscribing after any channel or connection loss and after the
// broker cancels its subscription (its queue was deleted), declaring the
// topology again (Config.Setup of its Conn) before each subscription.
//
// Delivery is at least once and unordered: a message unacknowledged when a
// channel dies is delivered again, and with Concurrency > 1 handlers finish
// in any order.
//
// Acknowledgements are coalesced: when handlers finish, the consumer sends
// one basic.ack with multiple set for the longest run of the oldest
// deliveries that all succeeded, so a message is never acknowledged before
// its own handler returned nil, and a batch usually costs one frame to send
// and one settlement for the broker to log. A delivery that failed is
// rejected at once, on its own.
type Consumer struct {
	conn    *Conn
	cfg     ConsumerConfig
	handler BatchHandler
	logger  *slog.Logger
	// retries publishes the copies of failed messages through the default
	// exchange (nil unless FailureLimit is set).
	retries *Publisher
}

// NewConsumer returns a Consumer of cfg.Queue that passes each delivery to
// h (cfg.BatchSize is ignored).
func NewConsumer(conn *Conn, cfg ConsumerConfig, h Handler) *Consumer {
	cfg.BatchSize = 1
	return NewBatchConsumer(conn, cfg, func(ctx context.Context, ds []amqp.Delivery) []error {
		errs := make([]error, len(ds))
		for i, d := range ds {
			errs[i] = h(ctx, d)
		}
		return errs
	})
}

// NewBatchConsumer returns a Consumer of cfg.Queue that passes deliveries
// to h, up to cfg.BatchSize at a time.
func NewBatchConsumer(conn *Conn, cfg ConsumerConfig, h BatchHandler) *Consumer {
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 32
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1
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
	c := &Consumer{conn: conn, cfg: cfg, handler: h, logger: logger.With("queue", cfg.Queue)}
	if cfg.FailureLimit > 0 {
		c.retries = NewPublisher(conn, PublisherConfig{Exchange: "", ConfirmTimeout: retryConfirmTimeout, Logger: logger})
	}
	return c
}

// Run consumes until ctx ends, then stops taking deliveries, lets the
// handlers in flight finish and acknowledge (each within HandlerTimeout),
// and returns nil. Deliveries prefetched but not started are returned to the
// queue when the channel closes. Run returns an error only if the Conn was
// closed under it, or at once if FailureLimit is set without
// DeadLetterQueue.
func (c *Consumer) Run(ctx context.Context) error {
	if err := checkFailureConfig(c.cfg); err != nil {
		return err
	}
	if c.retries != nil {
		defer c.retries.Close()
	}
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

// ErrConsumerCanceled ends a session whose subscription the broker canceled
// (basic.cancel): its queue was deleted, or it moved away from the node.
var ErrConsumerCanceled = errors.New("rabbitmq: consumer canceled by the broker")

// session declares the topology again (the Conn's Setup), subscribes once
// and processes deliveries until the channel dies, the broker cancels the
// subscription, or ctx ends.
//
// A canceled subscription leaves the channel open: amqp091 only closes the
// deliveries channel, so a session that watched the channel alone would
// wait forever on a queue that no longer exists, taking nothing and saying
// nothing. A cancel therefore ends the session like a channel loss, once
// the handlers have finished and settled what had been delivered, and Run
// starts the next one, whose Setup declares the queue again.
func (c *Consumer) session(ctx context.Context) error {
	ch, err := c.conn.Channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	// Every session, not only a new connection's first: the previous one
	// may have ended because the queue was deleted.
	if err := c.conn.setup(ch); err != nil {
		return err
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("qos: %w", err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	canceled := ch.NotifyCancel(make(chan string, 1))
	deliveries, err := ch.Consume(c.cfg.Queue, c.cfg.Tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", c.cfg.Queue, err)
	}

	// The library hands deliveries over one at a time through an unbuffered
	// channel, from a goroutine that must run again before the next is
	// ready; a buffer of the prefetch window lets a worker take at once
	// every delivery already received, so a backlog comes in full batches.
	received := make(chan amqp.Delivery, c.cfg.Prefetch)
	done := make(chan struct{})
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		defer close(received)
		for d := range deliveries {
			select {
			case received <- d:
			case <-done:
				return
			}
		}
	}()

	// stop ends the workers' intake; they finish the messages in hand.
	stop := make(chan struct{})
	in := &intake{deliveries: received, stop: stop, max: c.cfg.BatchSize, acks: &acker{}}
	var wg sync.WaitGroup
	for range c.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				batch, ok := in.take()
				if !ok {
					return // stopping, or the channel or connection is gone
				}
				c.handle(ctx, batch, in.acks)
			}
		}()
	}
	// idle closes when every worker has returned: the deliveries ended.
	idle := make(chan struct{})
	go func() {
		wg.Wait()
		close(idle)
	}()

	var result error
	select {
	case <-ctx.Done():
	case cerr := <-closed:
		result = closeError(cerr)
	case tag, ok := <-canceled:
		if !ok {
			// amqp091 closes its notification channels when the channel
			// ends, the close's own first.
			result = closeError(<-closed)
			break
		}
		result = fmt.Errorf("%w (consumer tag %q)", ErrConsumerCanceled, tag)
		c.logger.Warn("rabbitmq: broker canceled the consumer (queue deleted?); finishing the deliveries in hand, then resubscribing",
			"tag", tag)
		// amqp091 closes the deliveries channel right after the cancel: the
		// workers handle and settle everything delivered before it (the
		// channel is still open, so the acks go out), then return. Those
		// messages left the queue with their delivery; dropping them here
		// would lose them if the queue is gone.
		select {
		case <-idle:
		case <-ctx.Done():
		case <-closed:
		}
	case <-idle:
		// The deliveries channel closed without a cancel or a close seen
		// (neither should happen): nothing more will come on this one.
		result = errors.New("deliveries channel closed")
	}
	close(stop)
	<-idle
	// What was received and not taken goes back to the queue with the
	// channel, which also ends the forwarder's range.
	close(done)
	ch.Close()
	<-forwarded
	return result
}

// closeError is why a channel closed, from its NotifyClose.
func closeError(cerr *amqp.Error) error {
	if cerr != nil {
		return cerr
	}
	return errors.New("channel closed")
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

// handle runs the handler on the batch on a context that survives ctx's
// cancellation, so shutdown finishes the messages instead of abandoning a
// half-done effect, then settles each delivery through acks. Deliveries
// whose handler failed with a Transient error are retried in place, as a
// smaller batch, with backoff up to MaxBackoff, until they succeed, fail for
// good, or the consumer stops.
//
// A message that failed is counted and published again, or dead-lettered,
// when the consumer counts failures (countFailures); otherwise, or when
// that publish fails, it is requeued with basic.reject: a failed delivery,
// counted toward the queue's broker-side delivery limit on every RabbitMQ
// version. One still failing transiently when the consumer stops is
// requeued with basic.nack: from RabbitMQ 4.3 on, a nack is a return that
// does not count (before 4.3 both count).
func (c *Consumer) handle(ctx context.Context, batch []amqp.Delivery, acks *acker) {
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = c.cfg.MinBackoff
	retry.MaxInterval = c.cfg.MaxBackoff
	errs := make([]error, len(batch))
	pending := make([]int, len(batch)) // indexes into batch still to handle
	for i := range pending {
		pending[i] = i
	}
	for {
		ds := make([]amqp.Delivery, len(pending))
		for j, i := range pending {
			ds[j] = batch[i]
		}
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HandlerTimeout)
		results := c.callHandler(hctx, ds)
		cancel()
		var again []int
		for j, i := range pending {
			errs[i] = results[j]
			if IsTransient(results[j]) {
				again = append(again, i)
			}
		}
		if len(again) == 0 || ctx.Err() != nil {
			break
		}
		pending = again
		wait := retry.NextBackOff()
		c.logger.Warn("rabbitmq: handler failed transiently, retrying in place", "message_id", batch[again[0]].MessageId,
			"messages", len(again), "in", wait, "err", errs[again[0]])
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
	c.countFailures(batch, errs)
	for i, err := range errs {
		if err != nil {
			d := batch[i]
			c.logger.Warn("rabbitmq: handler failed, requeueing", "message_id", d.MessageId,
				"redelivered", d.Redelivered, "delivery_count", d.Headers["x-delivery-count"], "err", err)
		}
	}
	for _, err := range acks.settle(batch, errs) {
		// The channel is gone: the broker requeues what was not
		// acknowledged itself, and a redelivery of a committed effect is
		// a duplicate the handler recognises.
		c.logger.Warn("rabbitmq: settle failed", "err", err)
	}
}

// callHandler calls the handler on ds and returns one error per delivery.
// A handler panic becomes an error, so one bad message cannot take down the
// process: it goes to the dead-letter queue instead. A batch that panics is
// handled again one delivery at a time, so only the message at fault fails.
func (c *Consumer) callHandler(ctx context.Context, ds []amqp.Delivery) []error {
	errs, err := c.callOnce(ctx, ds)
	if err == nil {
		return errs
	}
	errs = make([]error, len(ds))
	if len(ds) == 1 {
		errs[0] = err
		return errs
	}
	for i := range ds {
		one, err := c.callOnce(ctx, ds[i:i+1])
		if err != nil {
			errs[i] = err
		} else {
			errs[i] = one[0]
		}
	}
	return errs
}

// callOnce calls the handler and recovers its panic; a handler returning
// the wrong number of errors is a bug, reported as a failure of the batch.
func (c *Consumer) callOnce(ctx context.Context, ds []amqp.Delivery) (errs []error, err error) {
	defer func() {
		if r := recover(); r != nil {
			errs, err = nil, fmt.Errorf("handler panic: %v", r)
		}
	}()
	errs = c.handler(ctx, ds)
	if len(errs) != len(ds) {
		return nil, fmt.Errorf("handler returned %d results for %d deliveries", len(errs), len(ds))
	}
	return errs, nil
}

// intake hands the deliveries of one channel to the workers in batches, in
// delivery order, and registers each with the acker as it is taken, so the
// acker knows every delivery older than the ones it acknowledges.
type intake struct {
	mu         sync.Mutex
	deliveries <-chan amqp.Delivery
	stop       <-chan struct{}
	max        int
	acks       *acker
}

// take waits for a delivery, then adds those already received, up to max.
// It returns false when stop is closed or the channel is gone.
func (in *intake) take() ([]amqp.Delivery, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	var batch []amqp.Delivery
	select {
	case <-in.stop:
		return nil, false
	case d, ok := <-in.deliveries:
		if !ok {
			return nil, false
		}
		batch = append(batch, d)
	}
	for len(batch) < in.max {
		select {
		case d, ok := <-in.deliveries:
			if !ok {
				in.acks.track(batch)
				return batch, true
			}
			batch = append(batch, d)
			continue
		default:
		}
		break
	}
	in.acks.track(batch)
	return batch, true
}

// acker settles the deliveries of one channel. Deliveries are tracked in the
// order they were taken (delivery-tag order); a successful one is
// acknowledged only once every older delivery is settled too, then with one
// basic.ack (multiple) for the whole run, so that an acknowledgement never
// covers a delivery still being handled. A failed one is rejected or nacked
// at once: it is no longer outstanding on the channel, so a later multiple
// acknowledgement does not cover it.
type acker struct {
	mu    sync.Mutex
	queue []tracked // oldest first; settled entries leave from the front
}

// tracked is one delivery the acker knows of.
type tracked struct {
	d    amqp.Delivery
	done bool // handled and, if it failed, already rejected
	ok   bool // handled successfully, to acknowledge
}

// track registers ds, just received, as outstanding.
func (a *acker) track(ds []amqp.Delivery) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range ds {
		a.queue = append(a.queue, tracked{d: d})
	}
}

// settle records the outcome of each of ds (tracked before), rejects the
// failures, and acknowledges the run of successes that no longer has an
// unsettled delivery before it. It returns the errors of the channel
// operations.
func (a *acker) settle(ds []amqp.Delivery, errs []error) []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var failed []error
	outcome := make(map[uint64]error, len(ds))
	for i, d := range ds {
		outcome[d.DeliveryTag] = errs[i]
		if errs[i] == nil {
			continue
		}
		var rerr error
		if IsTransient(errs[i]) {
			rerr = d.Nack(false, true)
		} else {
			rerr = d.Reject(true)
		}
		if rerr != nil {
			failed = append(failed, fmt.Errorf("requeue %s: %w", d.MessageId, rerr))
		}
	}
	for i := range a.queue {
		if err, ok := outcome[a.queue[i].d.DeliveryTag]; ok && !a.queue[i].done {
			a.queue[i].done, a.queue[i].ok = true, err == nil
		}
	}
	// The settled front of the queue: acknowledge its successes with one
	// frame, multiple when it covers more than one.
	n, last, acked := 0, -1, 0
	for n < len(a.queue) && a.queue[n].done {
		if a.queue[n].ok {
			last = n
			acked++
		}
		n++
	}
	if last >= 0 {
		if err := a.queue[last].d.Ack(acked > 1); err != nil {
			failed = append(failed, fmt.Errorf("ack %d messages: %w", acked, err))
		}
	}
	a.queue = append(a.queue[:0], a.queue[n:]...)
	return failed
}
