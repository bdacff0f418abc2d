package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/deadletter"
	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/inbox"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/tracing"
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
// rabbitmq.Handler of the notify.order_paid queue, and its HandleBatch
// the rabbitmq.BatchHandler.
type Consumer struct {
	db     *gorm.DB
	cfg    ConsumerConfig
	logger *slog.Logger

	processed  prometheus.Counter
	batches    prometheus.Counter
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
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_notify_batches_total",
			Help: "Batches of deliveries committed by the consumer (events processed over batches is the mean batch).",
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
		for _, col := range []prometheus.Collector{c.processed, c.batches, c.duplicates, c.sequence, c.skipped} {
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

	// traceParent is the consume span's W3C traceparent (from the
	// delivery, not the body; "" outside a trace), which the notification
	// row keeps so that its SMTP send joins the checkout's trace.
	traceParent string
}

// orderData is what the consumer reads of an order (order.paid's data).
type orderData struct {
	ID    string `json:"id"`
	Email string `json:"email"`
	// AmountTotal (minor units) and Currency go into the notification for
	// the email: the sender reads no other package's table.
	AmountTotal int64  `json:"amount_total"`
	Currency    string `json:"currency"`
}

// refundData is what the consumer reads of a refund (order.refunded's data).
// Amount, in the currency's minor units, goes into the notification for the
// email: the sender reads no other package's table.
type refundData struct {
	ID      string `json:"id"`
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
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
		if err := json.Unmarshal(ev.Data, &r); err != nil || r.ID == "" || r.OrderID == "" || r.Amount <= 0 {
			return ev, fmt.Errorf("%w: %s %q lacks data.id, data.order_id or a positive data.amount", errMalformed, ev.Type, messageID)
		}
	}
	return ev, nil
}

// BatchSize is the most deliveries HandleBatch records in one statement
// (the service's rabbitmq batch size); internal/notify/pgbench_worker.sql
// runs a batch of this many order.paid events.
const BatchSize = 16

// Handle processes one delivery of an order event: HandleBatch of one.
func (c *Consumer) Handle(ctx context.Context, d amqp.Delivery) error {
	return c.HandleBatch(ctx, []amqp.Delivery{d})[0]
}

// item is one event of a batch as HandleBatch works on it.
type item struct {
	messageID string
	ev        envelope
	body      []byte
	// notificationID is set for an unsequenced order.paid event: its
	// notification is inserted by the recording statement itself.
	notificationID string
	first          bool
	adm            inbox.Admission
	// span is the delivery's consume span, a child of the traceparent in
	// its AMQP headers.
	span trace.Span
}

// sequenced reports whether it is applied in its order's sequence
// (inbox.Admit); events published before there were sequences are not.
func (it *item) sequenced() bool { return it.ev.AggregateID != "" && it.ev.Sequence > 0 }

// HandleBatch processes deliveries of order events, returning one error per
// delivery (rabbitmq.BatchHandler). In one transaction it records
// (ConsumerName, message_id) of every event in the inbox and, for each
// event recorded for the first time that is its order's next (see
// inbox.Admit), applies it and the parked events it unblocks: order.paid
// and order.refunded insert a pending email notification (kind order_paid,
// or order_refunded per refund; ON CONFLICT DO NOTHING), other events only
// move the order's sequence on. An event whose predecessor has not been
// applied yet is parked in the database instead, and the delivery acked: it
// is applied when its predecessor comes, or by ReleaseOverdue after the
// wait. Events without a sequence (published before there were sequences)
// are applied at once. The inbox records and the order.paid notifications of
// unsequenced events are one statement; a batch with nothing else to do is
// that statement alone, which commits by itself.
//
// Sequenced events are admitted in (order, sequence) order whatever their
// order in the batch, which keeps an order's events in sequence and makes
// concurrent batches lock the orders' cursors in one order. A message that
// comes twice in a batch is processed once, and its copy is a duplicate.
//
// A delivery's result is nil, so it is acked, after that commit or when the
// message is a duplicate (nothing is written). It is an error, so the
// delivery is requeued, when its body is not a valid event (the others go
// on), or when the transaction fails: a rollback forgets the inbox records
// too, so the redelivery is processed as new. A failure of the database
// itself is returned, marked rabbitmq.Transient, for every delivery of the
// batch; any other failure (an event the database refuses, such as one of
// an unknown order) is the fault of some message of the batch, so each
// delivery is then processed again on its own, and only the messages at
// fault fail and spend their deliveries toward the dead-letter queue.
func (c *Consumer) HandleBatch(ctx context.Context, ds []amqp.Delivery) []error {
	errs := make([]error, len(ds))
	items := make([]*item, 0, len(ds))
	byID := map[string]*item{}
	of := make([]*item, len(ds)) // the item each delivery is, or a copy of
	copies := 0
	for i, d := range ds {
		// A copy sent back through the default exchange (a retry, a
		// redrive) has the queue's name as routing key: the event type
		// travels in a header.
		ev, err := parse(d.Body, d.MessageId, rabbitmq.OriginalRoutingKey(d))
		if err != nil {
			errs[i] = fmt.Errorf("notify: handle %s: %w", d.MessageId, err)
			continue
		}
		messageID := d.MessageId
		if messageID == "" {
			messageID = ev.ID // the body's event id is the same stable id
		}
		if it, ok := byID[messageID]; ok {
			of[i] = it
			copies++
			continue
		}
		it := &item{messageID: messageID, ev: ev, body: d.Body}
		var ictx context.Context
		ictx, it.span = tracing.Start(tracing.FromHeaders(ctx, d.Headers), "notify.order_paid process",
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
				tracing.AttrEventID.String(messageID), tracing.AttrEventType.String(ev.Type),
				tracing.AttrOrderID.String(ev.AggregateID)))
		it.ev.traceParent = tracing.TraceParent(ictx)
		if !it.sequenced() && ev.Type == outbox.TypeOrderPaid {
			it.notificationID = ids.New("ntf")
		}
		byID[messageID] = it
		of[i] = it
		items = append(items, it)
	}
	if len(items) == 0 {
		return errs
	}

	recordStart := time.Now()
	created, err := c.record(ctx, items)
	traceRecord(items, recordStart, err)
	if err != nil && len(ds) > 1 && !transient(err) {
		// Some message of the batch is at fault: find it.
		for i, d := range ds {
			if of[i] != nil {
				errs[i] = c.HandleBatch(ctx, []amqp.Delivery{d})[0]
			}
		}
		return errs
	}
	if err != nil {
		err = fmt.Errorf("notify: handle %s: %w", items[0].messageID, err)
		if len(items) > 1 {
			err = fmt.Errorf("notify: handle %s and %d more: %w", items[0].messageID, len(items)-1, err)
		}
		if transient(err) {
			// The database is away, not the message: hold the deliveries
			// and retry rather than spend them toward the DLQ.
			err = rabbitmq.Transient(err)
		}
		for i := range ds {
			if of[i] != nil {
				errs[i] = err
			}
		}
		return errs
	}

	c.batches.Inc()
	duplicates := copies
	for _, it := range items {
		if !it.first {
			duplicates++
			continue
		}
		c.processed.Inc()
		switch {
		case it.adm.Parked:
			c.sequence.WithLabelValues(SequenceParked).Inc()
		case it.adm.Late:
			c.sequence.WithLabelValues(SequenceLate).Inc()
		case len(it.adm.Apply) > 0:
			c.sequence.WithLabelValues(SequenceInOrder).Inc()
			c.sequence.WithLabelValues(SequenceUnparked).Add(float64(len(it.adm.Apply) - 1))
		}
	}
	c.duplicates.WithLabelValues(ConsumerName).Add(float64(duplicates))
	if created > 0 && c.cfg.OnNew != nil {
		c.cfg.OnNew()
	}
	return errs
}

// traceRecord ends each item's consume span with a child span, inbox.record,
// for the batch's shared transaction (which began at start and ended with
// err): the inbox insert and the notification it wrote, with
// checkout.inbox.first telling a first delivery from a duplicate.
func traceRecord(items []*item, start time.Time, err error) {
	for _, it := range items {
		if !it.span.IsRecording() {
			it.span.End()
			continue
		}
		ctx := trace.ContextWithSpan(context.Background(), it.span)
		_, rec := tracing.Start(ctx, "inbox.record", trace.WithTimestamp(start),
			trace.WithAttributes(tracing.AttrInboxFirst.Bool(it.first)))
		tracing.End(rec, err)
		tracing.End(it.span, err)
	}
}

// transient reports whether err, from a batch's transaction, is the
// database's trouble rather than a message's: postgres.IsTransient, except
// for an event found malformed inside the transaction (a refund of an
// unknown order), which no retry can apply.
func transient(err error) bool {
	return !errors.Is(err, errMalformed) && postgres.IsTransient(err)
}

// record makes the batch's effects durable, setting each item's first and
// adm, and returns how many notifications it created.
func (c *Consumer) record(ctx context.Context, items []*item) (int, error) {
	// One order for the statement's rows, so that two batches holding the
	// same messages (re-publishes) take the inbox's index entries in the
	// same order.
	sort.Slice(items, func(i, j int) bool { return items[i].messageID < items[j].messageID })
	alone := c.afterInbox == nil
	for _, it := range items {
		if it.sequenced() || it.ev.Type == outbox.TypeOrderRefunded {
			alone = false // more statements after the recording one
		}
	}
	if alone {
		return recordBatch(ctx, c.db, items)
	}

	created := 0
	err := postgres.WithTx(ctx, c.db, func(tx *gorm.DB) error {
		var err error
		if created, err = recordBatch(ctx, tx, items); err != nil {
			return err
		}
		if c.afterInbox != nil {
			if err := c.afterInbox(); err != nil {
				return err
			}
		}
		var seq []*item
		for _, it := range items {
			switch {
			case !it.first:
			case it.sequenced():
				seq = append(seq, it)
			case it.ev.Type == outbox.TypeOrderRefunded:
				n, err := c.apply(ctx, tx, it.ev)
				if err != nil {
					return err
				}
				created += n
			}
		}
		sort.Slice(seq, func(i, j int) bool {
			a, b := seq[i].ev, seq[j].ev
			return a.AggregateID < b.AggregateID || a.AggregateID == b.AggregateID && a.Sequence < b.Sequence
		})
		for _, it := range seq {
			n, err := c.admit(ctx, tx, it)
			if err != nil {
				return err
			}
			created += n
		}
		return nil
	})
	if err != nil {
		for _, it := range items {
			it.first, it.adm = false, inbox.Admission{}
		}
		return 0, err
	}
	return created, nil
}

// admit applies a sequenced event recorded for the first time, and the
// parked events it unblocks, in their order's sequence (inbox.Admit); it
// returns how many notifications that created.
func (c *Consumer) admit(ctx context.Context, tx *gorm.DB, it *item) (int, error) {
	var err error
	it.adm, err = inbox.Admit(ctx, tx, ConsumerName, inbox.Sequenced{
		MessageID: it.messageID, AggregateID: it.ev.AggregateID, Seq: it.ev.Sequence, Body: it.body,
		TraceParent: it.ev.traceParent})
	if err != nil {
		return 0, err
	}
	created := 0
	for i, s := range it.adm.Apply {
		e := it.ev
		if i > 0 { // a parked successor, checked when it arrived
			if e, err = parse(s.Body, s.MessageID, ""); err != nil {
				return 0, err
			}
			e.traceParent = s.TraceParent
		}
		n, err := c.apply(ctx, tx, e)
		if err != nil {
			return 0, err
		}
		created += n
	}
	return created, nil
}

// recordBatch records every item in the inbox (inbox.QueueRecord) and
// inserts the notification of each unsequenced order.paid event among
// them, in one batch (postgres.Batch: one round trip on db, the statements
// in turn inside a transaction). It sets each item's first and returns how
// many notifications it inserted.
//
// The notifications go in whatever the inbox says, and ON CONFLICT DO
// NOTHING on notifications_once (an order's one email of its kind) makes
// a duplicate's a no-op: the first delivery's row is there, since
// notifications are never deleted, or is being written by a transaction
// the insert waits for. So the batch needs no answer from the inbox
// before it ends, and the inbox's answer still decides what else happens.
func recordBatch(ctx context.Context, db *gorm.DB, items []*item) (int, error) {
	var b postgres.Batch
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.messageID
	}
	rec := inbox.QueueRecord(&b, ConsumerName, ids)
	created := 0
	if query, args := notificationsStatement(items); query != "" {
		b.Queue(query, args, func(r pgx.Row) error { return r.Scan(&created) })
	}
	if err := postgres.Send(ctx, db, &b); err != nil {
		return 0, fmt.Errorf("record %d events in the inbox: %w", len(items), err)
	}
	for _, it := range items {
		it.first = rec.First[it.messageID]
	}
	return created, nil
}

// notificationsStatement is recordBatch's INSERT of the notifications of
// items (those with a notificationID), returning how many it inserted, and
// its arguments; "" when no item has one.
func notificationsStatement(items []*item) (string, []any) {
	var b strings.Builder
	b.WriteString(`WITH ev (notification_id, order_id, tenant_id, recipient, order_amount, currency, traceparent) AS (VALUES `)
	args := make([]any, 0, 7*len(items)+2)
	n := 0
	for _, it := range items {
		if it.notificationID == "" {
			continue
		}
		if n > 0 {
			b.WriteString(", ")
		}
		n++
		b.WriteString("(?, ?, ?, ?, ?::bigint, ?, ?::text)")
		var o orderData
		_ = json.Unmarshal(it.ev.Data, &o) // checked by parse
		args = append(args, it.notificationID, o.ID, it.ev.TenantID, o.Email, o.AmountTotal, o.Currency, nullable(it.ev.traceParent))
	}
	if n == 0 {
		return "", nil
	}
	b.WriteString(`),
notified AS (INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, event_seq, order_amount, currency, traceparent)
	SELECT ev.notification_id, ev.order_id, ev.tenant_id, ?, ev.recipient, 'pending', ?, NULL, ev.order_amount, ev.currency, ev.traceparent
	FROM ev
	ON CONFLICT DO NOTHING RETURNING id)
SELECT count(*) FROM notified`)
	args = append(args, ChannelEmail, KindOrderPaid)
	return b.String(), args
}

// holdBehindDeadLetter keeps an order's parked event parked while one of
// its predecessors is a dead letter not yet redriven, or redriven less than
// wait ago (on its way again): that predecessor is known, not lost, so
// waiting longer would not help the order but releasing would send its
// emails out of order (a refund email before the paid one).
func holdBehindDeadLetter(wait time.Duration) inbox.Hold {
	return func(ctx context.Context, tx *gorm.DB, orderID string, applied, seq int64) (bool, error) {
		return deadletter.Holds(ctx, tx, orderID, applied, seq, wait)
	}
}

// ReleaseOverdue applies the events parked for longer than wait, each
// after the predecessors it was waiting for are given up on, unless one of
// them is an unresolved dead letter (holdBehindDeadLetter) (counted in
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
		released, skipped, err = inbox.ReleaseOverdue(ctx, tx, ConsumerName, wait, 100, holdBehindDeadLetter(wait))
		if err != nil {
			return err
		}
		for _, s := range released {
			ev, err := parse(s.Body, s.MessageID, "")
			ev.traceParent = s.TraceParent
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
			// transient, not postgres.IsTransient: a malformed event (its
			// order gone) is not the server's answer, which IsTransient
			// would call the connection's trouble, and retry for ever.
			if err != nil {
				if transient(err) {
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
		res = tx.WithContext(ctx).Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, event_seq, order_amount, currency, traceparent)
			VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)
			ON CONFLICT DO NOTHING`,
			ids.New("ntf"), o.ID, ev.TenantID, ChannelEmail, o.Email, KindOrderPaid, seq, o.AmountTotal, o.Currency, nullable(ev.traceParent))
	case outbox.TypeOrderRefunded:
		var r refundData
		_ = json.Unmarshal(ev.Data, &r) // checked by parse
		to, err := orders.RecipientOf(ctx, tx, r.OrderID)
		if errors.Is(err, orders.ErrNotFound) {
			return 0, fmt.Errorf("%w: order %s of refund %s does not exist", errMalformed, r.OrderID, r.ID)
		}
		if err != nil {
			return 0, err
		}
		res = tx.WithContext(ctx).Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, refund_id, refund_amount, event_seq, order_amount, currency, traceparent)
			VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT DO NOTHING`,
			ids.New("ntf"), r.OrderID, ev.TenantID, ChannelEmail, to.Email, KindOrderRefunded, r.ID, r.Amount, seq, to.AmountTotal, to.Currency, nullable(ev.traceParent))
	default:
		return 0, nil // sequenced, nothing to send
	}
	if res.Error != nil {
		return 0, fmt.Errorf("insert %s notification for %s: %w", ev.Type, ev.ID, res.Error)
	}
	return int(res.RowsAffected), nil
}

// nullable is s, or NULL for "".
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
