package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/inbox"
	"github.com/onceonly/checkout/internal/outbox"
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

// Consumer turns order events into pending email notifications, applying
// each order's events in their sequence. Its Handle method is the
// rabbitmq.Handler of the notify.order_paid queue.
type Consumer struct {
	db     *gorm.DB
	cfg    ConsumerConfig
	logger *slog.Logger

	processed  prometheus.Counter
	duplicates *prometheus.CounterVec
	sequence   *prometheus.CounterVec
	skipped    prometheus.Counter

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
			Help: "Order events recorded in the inbox for the first time (applied, or parked until their predecessor comes).",
		}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_inbox_duplicates_total",
			Help: "Deliveries already in the inbox (redeliveries and re-publishes), acked without effect, by consumer.",
		}, []string{"consumer"}),
	}
	c.sequence = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "checkout_notify_sequence_events_total",
		Help: "Sequenced order events by how they were applied: in_order; parked (came before a predecessor); " +
			"unparked (applied when the predecessor came); released_after_wait (applied without a predecessor after NOTIFY_SEQUENCE_WAIT); " +
			"late (came after its successors had been released).",
	}, []string{"result"})
	for _, r := range []string{SequenceInOrder, SequenceParked, SequenceUnparked, SequenceReleased, SequenceLate} {
		c.sequence.WithLabelValues(r) // exported at 0 from the start
	}
	c.skipped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "checkout_notify_sequence_skipped_total",
		Help: "Sequence numbers given up on after NOTIFY_SEQUENCE_WAIT: events applied out of order because these had not arrived.",
	})
	c.duplicates.WithLabelValues(ConsumerName) // exported at 0 from the start
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{c.processed, c.duplicates, c.sequence, c.skipped} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("notify: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// envelope is the part of an event body the consumer reads:
// {"id","type","occurred_at","tenant_id","aggregate_id","sequence","data"}.
type envelope struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	TenantID    string          `json:"tenant_id"`
	AggregateID string          `json:"aggregate_id"`
	Sequence    int64           `json:"sequence"`
	Data        json.RawMessage `json:"data"`
}

// orderData is what the consumer reads of an order (order.paid's data).
type orderData struct {
	ID    string `json:"id"`
	Email string `json:"email"`
}

// refundData is what the consumer reads of a refund (order.refunded's data).
type refundData struct {
	ID      string `json:"id"`
	OrderID string `json:"order_id"`
}

// errMalformed marks a message that can never succeed; it is still nacked
// with requeue, and the queue's delivery limit moves it to the dead-letter
// queue.
var errMalformed = errors.New("malformed event")

// parse decodes and checks an event body; typ is the routing key, used when
// the body has no type.
func parse(body []byte, messageID, typ string) (envelope, error) {
	var ev envelope
	if err := json.Unmarshal(body, &ev); err != nil {
		return ev, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if ev.Type == "" {
		ev.Type = typ
	}
	if ev.ID == "" {
		ev.ID = messageID
	}
	if messageID == "" {
		messageID = ev.ID
	}
	if messageID == "" || ev.TenantID == "" {
		return ev, fmt.Errorf("%w: message %q lacks id or tenant_id", errMalformed, messageID)
	}
	switch ev.Type {
	case outbox.TypeOrderPaid:
		var o orderData
		if err := json.Unmarshal(ev.Data, &o); err != nil || o.ID == "" || o.Email == "" {
			return ev, fmt.Errorf("%w: %s %q lacks data.id or data.email", errMalformed, ev.Type, messageID)
		}
	case outbox.TypeOrderRefunded:
		var r refundData
		if err := json.Unmarshal(ev.Data, &r); err != nil || r.ID == "" || r.OrderID == "" {
			return ev, fmt.Errorf("%w: %s %q lacks data.id or data.order_id", errMalformed, ev.Type, messageID)
		}
	}
	return ev, nil
}

// Handle processes one delivery of an order event. In one transaction it
// records (ConsumerName, message_id) in the inbox and, when the event is
// its order's next (see inbox.Admit), applies it and the parked events it
// unblocks: order.paid and order.refunded insert a pending email
// notification (kind order_paid, or order_refunded per refund; ON CONFLICT
// DO NOTHING), other events only move the order's sequence on. An event
// whose predecessor has not been applied yet is parked in the database
// instead, and the delivery acked: it is applied when its predecessor comes,
// or by ReleaseOverdue after the wait. Events without a sequence (published
// before there were sequences) are applied at once.
//
// It returns nil, so the delivery is acked, after that commit or when the
// message is a duplicate (nothing is written). It returns an error, so the
// delivery is requeued, when the body is not a valid event or the database
// fails; a rollback forgets the inbox record too, so the redelivery is
// processed as new.
func (c *Consumer) Handle(ctx context.Context, d amqp.Delivery) error {
	ev, err := parse(d.Body, d.MessageId, d.RoutingKey)
	if err != nil {
		return err
	}
	messageID := d.MessageId
	if messageID == "" {
		messageID = ev.ID // the body's event id is the same stable id
	}

	first, created := false, 0
	var adm inbox.Admission
	err = postgres.WithTx(ctx, c.db, func(tx *gorm.DB) error {
		var err error
		first, err = inbox.Record(ctx, tx, ConsumerName, messageID)
		if err != nil || !first {
			return err
		}
		if c.afterInbox != nil {
			if err := c.afterInbox(); err != nil {
				return err
			}
		}
		if ev.AggregateID == "" || ev.Sequence < 1 {
			created, err = c.apply(ctx, tx, ev)
			return err
		}
		adm, err = inbox.Admit(ctx, tx, ConsumerName, inbox.Sequenced{
			MessageID: messageID, AggregateID: ev.AggregateID, Seq: ev.Sequence, Body: d.Body})
		if err != nil {
			return err
		}
		for i, s := range adm.Apply {
			e := ev
			if i > 0 { // a parked successor, checked when it arrived
				if e, err = parse(s.Body, s.MessageID, ""); err != nil {
					return err
				}
			}
			n, err := c.apply(ctx, tx, e)
			if err != nil {
				return err
			}
			created += n
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
	switch {
	case adm.Parked:
		c.sequence.WithLabelValues(SequenceParked).Inc()
	case adm.Late:
		c.sequence.WithLabelValues(SequenceLate).Inc()
	case len(adm.Apply) > 0:
		c.sequence.WithLabelValues(SequenceInOrder).Inc()
		c.sequence.WithLabelValues(SequenceUnparked).Add(float64(len(adm.Apply) - 1))
	}
	if created > 0 && c.cfg.OnNew != nil {
		c.cfg.OnNew()
	}
	return nil
}

// ReleaseOverdue applies the events parked for longer than wait, each
// after the predecessors it was waiting for are given up on (counted in
// checkout_notify_sequence_events_total{result="released_after_wait"} and
// checkout_notify_sequence_skipped_total). An event that can no longer be
// applied (its order is gone) is dropped with a log line, so it cannot hold
// up the others. It returns how many events it released.
func (c *Consumer) ReleaseOverdue(ctx context.Context, wait time.Duration) (int, error) {
	var released []inbox.Sequenced
	var skipped int64
	created := 0
	err := postgres.WithTx(ctx, c.db, func(tx *gorm.DB) error {
		var err error
		released, skipped, err = inbox.ReleaseOverdue(ctx, tx, ConsumerName, wait, 100)
		if err != nil {
			return err
		}
		for _, s := range released {
			ev, err := parse(s.Body, s.MessageID, "")
			if err == nil {
				if err = tx.SavePoint("release").Error; err != nil {
					return err
				}
				var n int
				if n, err = c.apply(ctx, tx, ev); err != nil {
					if rerr := tx.RollbackTo("release").Error; rerr != nil {
						return rerr
					}
				}
				created += n
			}
			if err != nil {
				if postgres.IsTransient(err) {
					return err
				}
				c.logger.Error("notify: dropping a parked event that cannot be applied", "message_id", s.MessageID, "err", err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("notify: release parked events: %w", err)
	}
	if len(released) > 0 {
		c.logger.Warn("notify: applied events whose predecessors did not arrive in time",
			"events", len(released), "skipped_sequence_numbers", skipped, "wait", wait)
	}
	c.sequence.WithLabelValues(SequenceReleased).Add(float64(len(released)))
	c.skipped.Add(float64(skipped))
	if created > 0 && c.cfg.OnNew != nil {
		c.cfg.OnNew()
	}
	return len(released), nil
}

// apply makes ev's effect inside tx and returns how many notifications it
// created (0 or 1).
func (c *Consumer) apply(ctx context.Context, tx *gorm.DB, ev envelope) (int, error) {
	var seq *int64
	if ev.Sequence > 0 {
		seq = &ev.Sequence
	}
	var res *gorm.DB
	switch ev.Type {
	case outbox.TypeOrderPaid:
		var o orderData
		_ = json.Unmarshal(ev.Data, &o) // checked by parse
		res = tx.WithContext(ctx).Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, event_seq)
			VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)
			ON CONFLICT DO NOTHING`,
			ids.New("ntf"), o.ID, ev.TenantID, ChannelEmail, o.Email, KindOrderPaid, seq)
	case outbox.TypeOrderRefunded:
		var r refundData
		_ = json.Unmarshal(ev.Data, &r) // checked by parse
		var email []string
		if err := tx.WithContext(ctx).Raw(`SELECT email FROM orders WHERE id = ?`, r.OrderID).Scan(&email).Error; err != nil {
			return 0, fmt.Errorf("load order %s: %w", r.OrderID, err)
		}
		if len(email) == 0 {
			return 0, fmt.Errorf("%w: order %s of refund %s does not exist", errMalformed, r.OrderID, r.ID)
		}
		res = tx.WithContext(ctx).Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, refund_id, event_seq)
			VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?)
			ON CONFLICT DO NOTHING`,
			ids.New("ntf"), r.OrderID, ev.TenantID, ChannelEmail, email[0], KindOrderRefunded, r.ID, seq)
	default:
		return 0, nil // sequenced, nothing to send
	}
	if res.Error != nil {
		return 0, fmt.Errorf("insert %s notification for %s: %w", ev.Type, ev.ID, res.Error)
	}
	return int(res.RowsAffected), nil
}
