package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/inbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// OnNew is called after a commit that created a notification, to wake
	// the sender (optional; it must not block).
	OnNew func()
	// Logger (default: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Consumer turns order.paid events into pending email notifications. Its
// Handle method is the rabbitmq.Handler of the notify.order_paid queue.
type Consumer struct {
	db     *gorm.DB
	cfg    ConsumerConfig
	logger *slog.Logger

	processed  prometheus.Counter
	duplicates *prometheus.CounterVec

	// afterInbox, when set by tests, runs inside the transaction right
	// after the inbox record; an error rolls the transaction back.
	afterInbox func() error
}

// NewConsumer returns a Consumer writing to db. It returns an error if the
// metrics cannot be registered.
func NewConsumer(db *gorm.DB, cfg ConsumerConfig) (*Consumer, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Consumer{
		db: db, cfg: cfg, logger: logger,
		processed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_notify_events_processed_total",
			Help: "order.paid events recorded for the first time (a notification was created or already existed).",
		}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_inbox_duplicates_total",
			Help: "Deliveries already in the inbox (redeliveries and re-publishes), acked without effect, by consumer.",
		}, []string{"consumer"}),
	}
	c.duplicates.WithLabelValues(ConsumerName) // exported at 0 from the start
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{c.processed, c.duplicates} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("notify: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// orderPaid is the part of the order.paid event body the consumer reads:
// {"id","type","occurred_at","tenant_id","data":{order}}.
type orderPaid struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	TenantID string `json:"tenant_id"`
	Data     struct {
		ID    string `json:"id"`
		Email string `json:"email"`
	} `json:"data"`
}

// errMalformed marks a message that can never succeed; it is still nacked
// with requeue, and the queue's delivery limit moves it to the dead-letter
// queue.
var errMalformed = errors.New("malformed order.paid event")

// Handle processes one order.paid delivery. In one transaction (one
// statement in it) it records (ConsumerName, message_id) in the inbox and
// inserts the pending email notification (ON CONFLICT (order_id, channel)
// DO NOTHING), then commits.
// It returns nil, so the delivery is acked, after that commit or when the
// message is a duplicate (nothing is written). It returns an error, so the
// delivery is requeued, when the body is not a valid event or the database
// fails; a rollback forgets the inbox record too, so the redelivery is
// processed as new.
func (c *Consumer) Handle(ctx context.Context, d amqp.Delivery) error {
	var ev orderPaid
	if err := json.Unmarshal(d.Body, &ev); err != nil {
		return fmt.Errorf("%w: %v", errMalformed, err)
	}
	messageID := d.MessageId
	if messageID == "" {
		messageID = ev.ID // the body's event id is the same stable id
	}
	if messageID == "" || ev.TenantID == "" || ev.Data.ID == "" || ev.Data.Email == "" {
		return fmt.Errorf("%w: message %q lacks id, tenant_id, data.id or data.email", errMalformed, messageID)
	}

	first, created := false, false
	err := postgres.WithTx(ctx, c.db, func(tx *gorm.DB) error {
		// The inbox record and the notification in one statement (one round
		// trip instead of two): the notification is inserted only when the
		// inbox row was, i.e. for a message seen for the first time.
		record, args := inbox.Statement(ConsumerName, messageID)
		args = append(args, ids.New("ntf"), ev.Data.ID, ev.TenantID, ChannelEmail, ev.Data.Email)
		var recorded, inserted int64
		err := tx.WithContext(ctx).Raw(`WITH i AS (`+record+` RETURNING 1),
			n AS (
				INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status)
				SELECT ?, ?, ?, ?, ?, 'pending' WHERE EXISTS (SELECT 1 FROM i)
				ON CONFLICT (order_id, channel) DO NOTHING
				RETURNING 1)
			SELECT (SELECT count(*) FROM i), (SELECT count(*) FROM n)`, args...).Row().Scan(&recorded, &inserted)
		if err != nil {
			return fmt.Errorf("record %s and its notification for %s: %w", messageID, ev.Data.ID, err)
		}
		first, created = recorded == 1, inserted == 1
		if !first {
			return nil
		}
		if c.afterInbox != nil {
			if err := c.afterInbox(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		err = fmt.Errorf("notify: handle %s: %w", messageID, err)
		if postgres.IsTransient(err) {
			// The database is away, not the message: hold the delivery and
			// retry rather than spend its deliveries toward the DLQ.
			return rabbitmq.Transient(err)
		}
		return err
	}
	if !first {
		c.duplicates.WithLabelValues(ConsumerName).Inc()
		return nil
	}
	c.processed.Inc()
	if created && c.cfg.OnNew != nil {
		c.cfg.OnNew()
	}
	return nil
}
