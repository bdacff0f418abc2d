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
// Publisher is safe for concurrent use; calls are serialised on one
// channel, which is reopened (reconnecting if needed) after any failure.
type Publisher struct {
	conn   *Conn
	cfg    PublisherConfig
	logger *slog.Logger

	mu sync.Mutex // guards ch; held for a whole Publish call
	ch *amqp.Channel
	// closed receives the channel's close; amqp091 closes it when the
	// channel ends for any reason.
	closed  chan *amqp.Error
	closing sync.WaitGroup // background channel closes, see reset
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
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	p.mu.Lock()
	defer p.mu.Unlock()

	ch, closed, err := p.channel(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}

	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		if err != nil { // a send failed: the channel is gone, fail the rest
			errs[i] = err
			continue
		}
		contentType := m.ContentType
		if contentType == "" {
			contentType = "application/json"
		}
		confirms[i], err = ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, m.RoutingKey, false, false, amqp.Publishing{
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

	timer := time.NewTimer(p.cfg.ConfirmTimeout)
	defer timer.Stop()
	broken := err != nil
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
			case cerr := <-closed:
				// amqp091 resolves pending confirms as nacks when the channel
				// shuts down; this case makes the wait end even if it did not.
				giveUp = errors.New("rabbitmq: channel closed before confirm")
				if cerr != nil {
					giveUp = fmt.Errorf("channel closed before confirm: %w", cerr)
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
	if giveUp != nil {
		broken = true
	}
	if broken {
		// After a timeout the channel's confirm state is unknown: start over.
		p.reset()
	}
	return errs
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
func (p *Publisher) channel(ctx context.Context) (*amqp.Channel, chan *amqp.Error, error) {
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, p.closed, nil
	}
	ch, err := p.conn.Channel(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return nil, nil, fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	p.ch = ch
	p.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	return ch, p.closed, nil
}

// reset drops the current channel. It closes it in the background because
// channel.close waits for the broker's close-ok, which a silent broker never
// sends (the heartbeat ends that wait); Close waits for these goroutines.
func (p *Publisher) reset() {
	if ch := p.ch; ch != nil {
		p.closing.Add(1)
		go func() {
			defer p.closing.Done()
			ch.Close()
		}()
	}
	p.ch, p.closed = nil, nil
}

// Close closes the publisher's channel. Pending Publish calls finish first.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.reset()
	p.mu.Unlock()
	p.closing.Wait()
	return nil
}
