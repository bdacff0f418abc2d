// Package notify tells buyers that their order is paid, and about each
// refund: it consumes the order events, records the intent to email as a
// notification row, and sends the email over SMTP.
//
// Emails about one order go out in the order of its events (CONTRACT.md v2,
// "Events"): the consumer applies an order's events in their sequence
// (parking an early one until its predecessor comes, for at most
// Config.SequenceWait), and the sender sends an order's notification only
// when none created before it is still waiting to be sent.
//
// The guarantees (CONTRACT.md, "Events"): one notification row per order and
// channel whatever the number of deliveries, because the consumer writes the
// inbox record and the row in one transaction and acks only after commit;
// the row, not the message, drives the sender, so a crash after the ack
// still sends; and each email carries the deterministic Message-ID
// <notification-{id}@checkout.local>. The sender is at least once: a crash
// between the SMTP server's acceptance and marking the row sent sends again
// with the same Message-ID, which receivers use to drop the duplicate.
package notify

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/rabbitmq"
)

// ConsumerName is the inbox consumer name of the order.paid consumer.
const ConsumerName = "notify.order_paid"

// ChannelEmail is the notification channel this package sends.
const ChannelEmail = "email"

// Notification kinds: what a notification row (and its email) is about.
const (
	KindOrderPaid     = "order_paid"     // one per paid order
	KindOrderRefunded = "order_refunded" // one per succeeded refund
)

// Results of checkout_notify_sequence_events_total.
const (
	SequenceInOrder  = "in_order"
	SequenceParked   = "parked"
	SequenceUnparked = "unparked"
	SequenceReleased = "released_after_wait"
	SequenceLate     = "late"
)

// Config configures a Service. Zero values get the defaults shown.
type Config struct {
	// Queue is the queue of order.paid events ("notify.order_paid").
	Queue string
	// DeadLetterQueue receives the events the handler failed FailureLimit
	// times (rabbitmq.DeadLetterQueueOf(Queue)).
	DeadLetterQueue string
	// FailureLimit is how many handler failures dead-letter an event
	// (rabbitmq.Names.DeliveryLimit, 5). Deliveries handed back by a stop
	// or a crash do not count.
	FailureLimit int
	// Prefetch is the consumer's unacknowledged window (128): enough for
	// every handler's batch and the next ones.
	Prefetch int
	// Concurrency is how many batches are handled at once (4): each waits
	// on its own transaction, so more than one keeps the database busy.
	Concurrency int
	// BatchSize is the most deliveries one transaction handles (BatchSize,
	// 16): the deliveries the broker has already sent, so a batch is full
	// only when messages wait.
	BatchSize int
	// SequenceWait is how long an event that came before its order's
	// previous event waits for it, parked, before it is applied anyway
	// (NOTIFY_SEQUENCE_WAIT, 30s).
	SequenceWait time.Duration
	// Sender configures the email sender.
	Sender SenderConfig
	// Logger (default: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Service runs the order events consumer, the release of overdue parked
// events and the notification sender.
type Service struct {
	consumer *rabbitmq.Consumer
	handler  *Consumer
	sender   *Sender
	mailer   Mailer
	cfg      Config
	logger   *slog.Logger
}

// NewService wires a consumer of cfg.Queue on conn and a sender through
// mailer, both on db. It returns an error if the metrics cannot be
// registered.
func NewService(db *gorm.DB, conn *rabbitmq.Conn, mailer Mailer, cfg Config) (*Service, error) {
	if cfg.Queue == "" {
		cfg.Queue = rabbitmq.DefaultNames().NotifyQueue
	}
	if cfg.DeadLetterQueue == "" {
		cfg.DeadLetterQueue = rabbitmq.DeadLetterQueueOf(cfg.Queue)
	}
	if cfg.FailureLimit <= 0 {
		cfg.FailureLimit = rabbitmq.DefaultNames().DeliveryLimit
	}
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 128
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = BatchSize
	}
	if cfg.SequenceWait <= 0 {
		cfg.SequenceWait = 30 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg.Sender.Logger = logger
	cfg.Sender.Registerer = cfg.Registerer
	sender, err := NewSender(db, mailer, cfg.Sender)
	if err != nil {
		return nil, err
	}
	handler, err := NewConsumer(db, ConsumerConfig{Logger: logger, Registerer: cfg.Registerer, OnNew: sender.Wake})
	if err != nil {
		return nil, err
	}
	return &Service{
		consumer: rabbitmq.NewBatchConsumer(conn, rabbitmq.ConsumerConfig{
			Queue:           cfg.Queue,
			Tag:             "",
			Prefetch:        cfg.Prefetch,
			Concurrency:     cfg.Concurrency,
			BatchSize:       cfg.BatchSize,
			HandlerTimeout:  15 * time.Second,
			FailureLimit:    cfg.FailureLimit,
			DeadLetterQueue: cfg.DeadLetterQueue,
			Logger:          logger,
		}, handler.HandleBatch),
		handler: handler,
		sender:  sender,
		mailer:  mailer,
		cfg:     cfg,
		logger:  logger,
	}, nil
}

// Run consumes and sends until ctx ends, then lets the messages and emails
// in flight finish, closes the mailer's idle sessions (an io.Closer mailer)
// and returns nil once every loop has ended. It returns
// an error only if a loop fails for good (the broker Conn was closed).
func (s *Service) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.consumer.Run(ctx); err != nil {
			return fmt.Errorf("notify: consumer: %w", err)
		}
		return nil
	})
	g.Go(func() error { return s.sender.Run(ctx) })
	g.Go(func() error { return s.releaseOverdue(ctx) })
	err := g.Wait()
	if c, ok := s.mailer.(io.Closer); ok {
		c.Close() // the idle SMTP sessions
	}
	return err
}

// releaseOverdue applies parked events whose wait is over, checking every
// SequenceWait/10 (at least 100ms, at most the sender's sweep interval).
func (s *Service) releaseOverdue(ctx context.Context) error {
	every := min(max(s.cfg.SequenceWait/10, 100*time.Millisecond), s.sender.cfg.SweepInterval)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := s.handler.ReleaseOverdue(ctx, s.cfg.SequenceWait); err != nil && ctx.Err() == nil {
			s.logger.Warn("notify: release overdue parked events", "err", err)
		}
	}
}
