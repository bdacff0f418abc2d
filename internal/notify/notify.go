// Package notify tells buyers that their order is paid: it consumes the
// order.paid events, records the intent to email as a notification row, and
// sends the email over SMTP.
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

// Config configures a Service. Zero values get the defaults shown.
type Config struct {
	// Queue is the queue of order.paid events ("notify.order_paid").
	Queue string
	// Prefetch is the consumer's unacknowledged window (32).
	Prefetch int
	// Concurrency is how many messages are handled at once (16): each
	// waits on its own transaction, so more of them keep the database busy.
	Concurrency int
	// Sender configures the email sender.
	Sender SenderConfig
	// Logger (default: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Service runs the order.paid consumer and the notification sender.
type Service struct {
	consumer *rabbitmq.Consumer
	sender   *Sender
}

// NewService wires a consumer of cfg.Queue on conn and a sender through
// mailer, both on db. It returns an error if the metrics cannot be
// registered.
func NewService(db *gorm.DB, conn *rabbitmq.Conn, mailer Mailer, cfg Config) (*Service, error) {
	if cfg.Queue == "" {
		cfg.Queue = rabbitmq.DefaultNames().NotifyQueue
	}
	if cfg.Prefetch <= 0 {
		cfg.Prefetch = 32
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
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
		consumer: rabbitmq.NewConsumer(conn, rabbitmq.ConsumerConfig{
			Queue:          cfg.Queue,
			Tag:            "",
			Prefetch:       cfg.Prefetch,
			Concurrency:    cfg.Concurrency,
			HandlerTimeout: 15 * time.Second,
			Logger:         logger,
		}, handler.Handle),
		sender: sender,
	}, nil
}

// Run consumes and sends until ctx ends, then lets the messages and emails
// in flight finish and returns nil once both loops have ended. It returns
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
	return g.Wait()
}
