package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Message is one message to publish.
type Message struct {
	// MessageID is the AMQP message_id property, stable across re-publishes
	// of the same event so consumers can deduplicate.
	MessageID string
	// RoutingKey routes the message in the exchange; it is also sent as the
	// AMQP type property unless Type is set.
	RoutingKey string
	// Type is the AMQP type property when it is not RoutingKey: a message
	// sent through the default exchange to one queue (a retry, a dead
	// letter sent again) keeps its event type (optional).
	Type string
	// Headers are the AMQP headers (optional), e.g. the W3C traceparent
	// the relay sends along (internal/tracing).
	Headers amqp.Table
	// ContentType is the AMQP content_type (default "application/json").
	ContentType string
	// Body is sent byte for byte.
	Body []byte
	// Timestamp is the AMQP timestamp property (optional).
	Timestamp time.Time
}

// Errors a publish result can wrap.
var (
	// ErrNacked means the broker refused responsibility for the message
	// (basic.nack): it may or may not have reached a queue; publish again.
	ErrNacked = errors.New("rabbitmq: broker nacked the message")
	// ErrConfirmTimeout means no confirm arrived in time: the message may or
	// may not have been taken; publish again.
	ErrConfirmTimeout = errors.New("rabbitmq: confirm timed out")
	// ErrUnroutable means the broker returned the message (basic.return):
	// no queue is bound for its routing key, so no one received it. The
	// Publisher declares the topology again before its next send; publish
	// again.
	ErrUnroutable = errors.New("rabbitmq: unroutable")
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Exchange receives every message.
	Exchange string
	// ConfirmTimeout bounds the wait for the confirms of one Publish call
	// (default 5s).
	ConfirmTimeout time.Duration
	// Logger receives channel losses (default: discard).
	Logger *slog.Logger
}

// Publisher publishes persistent messages to one exchange with publisher
// confirms (https://www.rabbitmq.com/docs/confirms#publisher-confirms).
//
// Publish returns only when each message is confirmed, nacked, or given up
// on: the wait ends when the confirm timeout passes or the channel or
// connection dies, whichever comes first. A confirmed message is the
// broker's responsibility: it has been routed to every bound queue and, the
// queues being durable and the message persistent, written to disk.
//
// Messages are published mandatory: one that no queue is bound for is
// returned (basic.return) and fails with ErrUnroutable, although the broker
// confirms it too. Every event has a consumer (the notification queue binds
// order.*), so a message without a queue means the queue was deleted (an
// operator, a policy), and confirming it would mark the outbox row
// published with the event gone. The caller publishes it again later, and
// the Publisher runs its Conn's Setup (DeclareTopology) before its next
// send, so a deleted queue comes back without waiting for a reconnect. So
// does a deleted exchange: a publish to it closes the channel with 404
// NOT_FOUND, and the next channel runs Setup before it sends.
//
// Publisher is safe for concurrent use. Sends are serialised on one
// channel, which is reopened (reconnecting if needed) after any failure;
// the waits for confirms are not, so several batches can have their
// confirms in flight at once (Send).
type Publisher struct {
	conn   *Conn
	cfg    PublisherConfig
	logger *slog.Logger

	mu      sync.Mutex // guards ch; held while sending
	ch      *pubChannel
	closing sync.WaitGroup // background channel closes and trackers, see reset

	// redeclare is set when a message came back unroutable or the channel
	// closed with 404 NOT_FOUND (no exchange): the next send runs the
	// Conn's Setup first.
	redeclare atomic.Bool
}

// pubChannel is a confirm-mode channel, the messages it has sent and not
// yet settled, and what tells its waiters it died.
type pubChannel struct {
	ch   *amqp.Channel
	sock *corkConn     // the connection's socket, corked while a batch is sent; may be nil
	dead chan struct{} // closed when the channel closes
	err  *amqp.Error   // why, when the broker said; set before dead closes

	mu      sync.Mutex
	pending map[uint64]*sent // by delivery tag (publish sequence number)
}

// sent is one message published on a pubChannel and its outcome, which
// the channel's tracker writes before it closes done.
type sent struct {
	id       string
	done     chan struct{} // closed at its ack or nack
	acked    bool
	returned *amqp.Return // the broker returned it: it reached no queue
}

// result is sent's outcome once done is closed.
func (m *sent) result() error {
	switch {
	case m.returned != nil:
		return fmt.Errorf("%w: %d %s", ErrUnroutable, m.returned.ReplyCode, m.returned.ReplyText)
	case m.acked:
		return nil
	default:
		return ErrNacked
	}
}

// NewPublisher returns a Publisher on conn. It opens its channel lazily.
func NewPublisher(conn *Conn, cfg PublisherConfig) *Publisher {
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = 5 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{conn: conn, cfg: cfg, logger: logger}
}

// Publish sends msgs in order as persistent messages and waits for their
// confirms. It returns one error per message, in the same order: nil for a
// confirmed message; ErrNacked, ErrConfirmTimeout or a channel error for the
// others, which the caller should publish again later. The broker keeps no
// ordering promise across re-publishes, so consumers must not rely on order.
//
// ctx bounds obtaining a channel and sending; the confirm wait is bounded by
// ConfirmTimeout even when ctx has no deadline.
func (p *Publisher) Publish(ctx context.Context, msgs []Message) []error {
	return p.Send(ctx, msgs)()
}

// Send is Publish in two halves: it sends msgs in order and returns at
// once; wait then waits for their confirms (ConfirmTimeout from the send)
// and returns what Publish would. Messages of successive Sends go out in
// the order of the calls, and their confirms can be awaited concurrently,
// which keeps the broker busy while a caller does other work (the outbox
// relay claims its next batch). wait must be called, once.
func (p *Publisher) Send(ctx context.Context, msgs []Message) (wait func() []error) {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return func() []error { return errs }
	}
	p.mu.Lock()
	pc, err := p.channel(ctx)
	if err != nil {
		p.mu.Unlock()
		for i := range errs {
			errs[i] = err
		}
		return func() []error { return errs }
	}
	if p.redeclare.CompareAndSwap(true, false) {
		// A message came back unroutable (its queue may have been deleted)
		// or the exchange was missing.
		// Declaring is idempotent; this send would otherwise fail the same.
		if err := p.conn.setup(pc.ch); err != nil {
			p.redeclare.Store(true)
			p.reset(pc) // a failed declare closes the channel
			p.mu.Unlock()
			for i := range errs {
				errs[i] = err
			}
			return func() []error { return errs }
		}
		p.logger.Info("rabbitmq: declared the topology again (a message was returned or the exchange was missing)")
	}
	confirms := make([]*sent, len(msgs))
	// One write for the batch instead of one a message (see corkConn).
	if pc.sock != nil {
		pc.sock.cork()
	}
	for i, m := range msgs {
		if err != nil { // a send failed: the channel is gone, fail the rest
			errs[i] = err
			continue
		}
		contentType := m.ContentType
		if contentType == "" {
			contentType = "application/json"
		}
		typ := m.Type
		if typ == "" {
			typ = m.RoutingKey
		}
		// Tracked before it is sent, since its return and confirm may
		// arrive before the publish call returns; p.mu makes this channel's
		// next sequence number this message's.
		tag := pc.ch.GetNextPublishSeqNo()
		confirms[i] = pc.track(tag, m.MessageID)
		var dc *amqp.DeferredConfirmation
		dc, err = pc.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, m.RoutingKey, true, false, amqp.Publishing{
			MessageId:    m.MessageID,
			Type:         typ,
			ContentType:  contentType,
			Headers:      m.Headers,
			DeliveryMode: amqp.Persistent,
			Timestamp:    m.Timestamp,
			Body:         m.Body,
		})
		if err == nil && (dc == nil || dc.DeliveryTag != tag) {
			err = errors.New("confirm sequence number out of step") // cannot happen while p.mu is held
		}
		if err != nil {
			pc.untrack(tag)
			confirms[i] = nil
			err = fmt.Errorf("publish %s: %w", m.MessageID, err)
			errs[i] = err
		}
	}
	if pc.sock != nil {
		if uerr := pc.sock.uncork(); uerr != nil {
			// The gathered messages never left: fail them now rather than
			// wait for confirms that cannot come.
			uerr = fmt.Errorf("publish: %w", uerr)
			for i := range msgs {
				if errs[i] == nil {
					errs[i], confirms[i] = uerr, nil
				}
			}
			err = uerr
		}
	}
	broken := err != nil
	p.mu.Unlock()
	deadline := time.Now().Add(p.cfg.ConfirmTimeout)

	return func() []error {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		var giveUp error // set once the wait has ended for all remaining confirms
		for i, m := range confirms {
			if m == nil {
				continue
			}
			if giveUp == nil {
				select {
				case <-m.done:
				case <-timer.C:
					giveUp = ErrConfirmTimeout
				case <-pc.dead:
					// A confirm that did not come before the channel died
					// never will.
					giveUp = errors.New("rabbitmq: channel closed before confirm")
					if pc.err != nil {
						giveUp = fmt.Errorf("channel closed before confirm: %w", pc.err)
					}
				}
			}
			if isDone(m.done) {
				errs[i] = m.result()
			} else {
				errs[i] = giveUp
			}
		}
		if giveUp != nil || broken {
			// After a failed send or a timeout the channel's confirm state
			// is unknown: start over (unless another batch already did).
			p.mu.Lock()
			p.reset(pc)
			p.mu.Unlock()
		}
		return errs
	}
}

// isDone reports whether done is closed.
func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// track registers a message about to be sent with tag.
func (pc *pubChannel) track(tag uint64, id string) *sent {
	m := &sent{id: id, done: make(chan struct{})}
	pc.mu.Lock()
	pc.pending[tag] = m
	pc.mu.Unlock()
	return m
}

// untrack forgets the message of tag, whose send failed: amqp091 gives its
// sequence number to the next publish.
func (pc *pubChannel) untrack(tag uint64) {
	pc.mu.Lock()
	delete(pc.pending, tag)
	pc.mu.Unlock()
}

// returned records a basic.return. The broker sends it before the confirm
// of its message, but it names the message only by its properties, so it
// is matched by message_id: every unsettled message with that id is marked
// returned. Two unsettled publishes of one id (a re-publish while the first
// is still unconfirmed) both fail then, which costs a duplicate publish
// later, never a message reported delivered that was not.
func (pc *pubChannel) returned(r amqp.Return) (matched int) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for _, m := range pc.pending {
		if m.id == r.MessageId {
			m.returned = &r
			matched++
		}
	}
	return matched
}

// confirmed settles the message of c's tag.
func (pc *pubChannel) confirmed(c amqp.Confirmation) {
	pc.mu.Lock()
	m := pc.pending[c.DeliveryTag]
	delete(pc.pending, c.DeliveryTag)
	pc.mu.Unlock()
	if m != nil {
		m.acked = c.Ack
		close(m.done)
	}
}

// trackConfirms settles pc's messages from its confirms and returns until
// the channel closes them. amqp091 delivers both from the connection's one
// reader goroutine, each listener send completing before the next frame is
// handled, so a message's return is in returns before its confirm is in
// confirms: taking every return already there before each confirm applies
// them in the broker's order whatever the buffers hold.
func (p *Publisher) trackConfirms(pc *pubChannel, confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	take := func(r amqp.Return, ok bool) {
		if !ok {
			returns = nil
			return
		}
		p.redeclare.Store(true)
		if pc.returned(r) == 0 {
			p.logger.Warn("rabbitmq: a returned message matches no message in flight", "message_id", r.MessageId)
		}
	}
	for {
		select {
		case r, ok := <-returns:
			take(r, ok)
		case c, ok := <-confirms:
			if !ok {
				return // the channel is closed; its waiters see dead
			}
		drain:
			for returns != nil {
				select {
				case r, ok := <-returns:
					take(r, ok)
				default:
					break drain
				}
			}
			pc.confirmed(c)
		}
	}
}

// channel returns the confirm-mode channel, opening one if needed.
func (p *Publisher) channel(ctx context.Context) (*pubChannel, error) {
	if p.ch != nil && !p.ch.ch.IsClosed() {
		return p.ch, nil
	}
	ch, sock, err := p.conn.channel(ctx)
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	pc := &pubChannel{ch: ch, sock: sock, dead: make(chan struct{}), pending: map[uint64]*sent{}}
	// Buffered so that the connection's reader goroutine rarely waits for
	// the tracker (amqp091 drops a notification that waits 5s).
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	returns := ch.NotifyReturn(make(chan amqp.Return, 256))
	p.closing.Add(1)
	go func() {
		defer p.closing.Done()
		p.trackConfirms(pc, confirms, returns)
	}()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		for e := range closed { // amqp091 closes it when the channel ends
			pc.err = e
			if e != nil && e.Code == amqp.NotFound {
				// The exchange is gone (a publish to it closes the
				// channel): the next channel declares it first, else
				// it would meet the same 404 until a reconnect.
				p.redeclare.Store(true)
			}
		}
		close(pc.dead)
	}()
	p.ch = pc
	return pc, nil
}

// reset drops pc if it is still the current channel. It closes it in the
// background because channel.close waits for the broker's close-ok, which a
// silent broker never sends (the heartbeat ends that wait); Close waits for
// these goroutines. p.mu must be held.
func (p *Publisher) reset(pc *pubChannel) {
	if pc == nil || p.ch != pc {
		return
	}
	p.closing.Add(1)
	go func() {
		defer p.closing.Done()
		pc.ch.Close()
	}()
	p.ch = nil
}

// Close closes the publisher's channel. Pending Publish calls finish first.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.reset(p.ch)
	p.mu.Unlock()
	p.closing.Wait()
	return nil
}
