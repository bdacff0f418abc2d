package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Message is one message to publish.
type Message struct {
	// MessageID is the AMQP message_id property, stable across re-publishes
	// of the same event so consumers can deduplicate.
	MessageID string
	// RoutingKey routes the message in the exchange; it is also sent as the
	// AMQP type property.
	RoutingKey string
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
// Unroutable messages (no queue bound for the routing key) are confirmed and
// dropped, which is what a topic exchange without subscribers means.
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
	closing sync.WaitGroup // background channel closes, see reset
}

// pubChannel is a confirm-mode channel and what tells its waiters it died.
type pubChannel struct {
	ch   *amqp.Channel
	sock *corkConn     // the connection's socket, corked while a batch is sent; may be nil
	dead chan struct{} // closed when the channel closes
	err  *amqp.Error   // why, when the broker said; set before dead closes
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
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
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
		confirms[i], err = pc.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, m.RoutingKey, false, false, amqp.Publishing{
			MessageId:    m.MessageID,
			Type:         m.RoutingKey,
			ContentType:  contentType,
			DeliveryMode: amqp.Persistent,
			Timestamp:    m.Timestamp,
			Body:         m.Body,
		})
		if err != nil {
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
		for i, dc := range confirms {
			if dc == nil {
				continue
			}
			if giveUp == nil {
				select {
				case <-dc.Done():
				case <-timer.C:
					giveUp = ErrConfirmTimeout
				case <-pc.dead:
					// amqp091 resolves pending confirms as nacks when the
					// channel shuts down; this case makes the wait end even
					// if it did not.
					giveUp = errors.New("rabbitmq: channel closed before confirm")
					if pc.err != nil {
						giveUp = fmt.Errorf("channel closed before confirm: %w", pc.err)
					}
				}
			}
			switch {
			case isResolved(dc) && dc.Acked():
			case isResolved(dc):
				errs[i] = ErrNacked
			default:
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

// isResolved reports whether dc has its ack or nack.
func isResolved(dc *amqp.DeferredConfirmation) bool {
	select {
	case <-dc.Done():
		return true
	default:
		return false
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
	pc := &pubChannel{ch: ch, sock: sock, dead: make(chan struct{})}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		for e := range closed { // amqp091 closes it when the channel ends
			pc.err = e
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
