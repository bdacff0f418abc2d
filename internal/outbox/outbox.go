// Package outbox implements the transactional outbox pattern
// (https://microservices.io/patterns/data/transactional-outbox.html): an
// event is written in the same database transaction as the state change it
// announces, and a relay publishes it to RabbitMQ afterwards.
//
// Publication is at least once: the relay may publish a row again if it
// crashes between the broker's confirm and marking the row published. The
// message_id (the event id) is stable across re-publishes, so consumers
// deduplicate with the inbox.
package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/tracing"
)

// Routing keys of the events this service publishes to the checkout.events
// exchange.
const (
	TypeOrderCreated       = "order.created"
	TypeOrderPaid          = "order.paid"
	TypeOrderPaymentFailed = "order.payment_failed"
	// TypeOrderRefunded is published once per succeeded refund; its data is
	// the refund.
	TypeOrderRefunded = "order.refunded"
	// TypeOrderCanceled: an order in requires_action was canceled (POST
	// /v1/orders/{id}/cancel); its PaymentIntent is canceled at Stripe.
	TypeOrderCanceled = "order.canceled"
)

// Event is one domain event. Its JSON form is the message body:
// {"id","type","occurred_at","tenant_id","data"}.
type Event struct {
	// ID is "evt_" followed by 32 hex digits; it becomes the AMQP message_id.
	ID string `json:"id"`
	// Type is the routing key, e.g. TypeOrderPaid.
	Type string `json:"type"`
	// OccurredAt is when the state change committed (RFC 3339, UTC).
	OccurredAt time.Time `json:"occurred_at"`
	// TenantID is the merchant the event belongs to.
	TenantID string `json:"tenant_id"`
	// Data is the event's subject, e.g. the order as the API shows it.
	Data any `json:"data"`

	// AggregateID is the id of the entity the event is about (the order
	// id). Events with one get a Sequence.
	AggregateID string `json:"aggregate_id,omitempty"`
	// Sequence numbers the events of one aggregate 1, 2, 3, … in the order
	// their transactions commit; Add assigns it. Consumers that must apply
	// an aggregate's events in order use it (see inbox.Admit): the
	// relay publishes with several processes and retries, so the broker's
	// order is not the commit order.
	Sequence int64 `json:"sequence,omitempty"`

	// TraceParent is the W3C traceparent stored with the row (not in the
	// body): Add and Queue take it from their context's span, and the
	// relay publishes the event as that span's child (internal/tracing).
	TraceParent string `json:"-"`
}

// NewID returns a fresh event id: "evt_" and a UUIDv7 in hex.
func NewID() string { return ids.New("evt") }

// Add writes e to the outbox inside tx. An empty ID gets a new one and a zero
// OccurredAt gets the current time. An event with an AggregateID gets the
// aggregate's next Sequence: Add increments the aggregate's counter row in
// tx, so a concurrent transaction adding an event of the same aggregate
// waits for tx to end, and sequence numbers follow commit order without
// gaps (a rollback returns its number).
//
// Commit makes the event durable and due for publication together with the
// caller's other writes; rollback discards it with them, so no event is ever
// published for a change that did not happen. Add never talks to the broker.
//
// The insert is a span, outbox.add, whose traceparent the row keeps.
func Add(ctx context.Context, tx *gorm.DB, e Event) (err error) {
	ctx, span := tracing.Start(ctx, "outbox.add", trace.WithAttributes(
		tracing.AttrEventType.String(e.Type), tracing.AttrOrderID.String(e.AggregateID)))
	defer func() { tracing.End(span, err) }()
	query, args, err := statement(ctx, e)
	if err != nil {
		return err
	}
	if err := tx.WithContext(ctx).Exec(query, args...).Error; err != nil {
		return fmt.Errorf("outbox: add %s: %w", e.Type, err)
	}
	return nil
}

// Queue queues in b what Add does inside a transaction: e written to the
// outbox, committed with the rest of b (postgres.Batch) or discarded with
// it. Errors are those of encoding e; nothing was queued then. The row
// keeps the traceparent of ctx's span (the batch's sender's).
func Queue(ctx context.Context, b *postgres.Batch, e Event) error {
	query, args, err := statement(ctx, e)
	if err != nil {
		return err
	}
	b.Queue(query, args, nil)
	return nil
}

// statement returns Add's INSERT of e and its arguments, with Add's
// defaults applied; e's TraceParent defaults to ctx's span's.
func statement(ctx context.Context, e Event) (string, []any, error) {
	if e.TraceParent == "" {
		e.TraceParent = tracing.TraceParent(ctx)
	}
	var traceparent *string // NULL when tracing is off
	if e.TraceParent != "" {
		traceparent = &e.TraceParent
	}
	if e.ID == "" {
		e.ID = NewID()
	}
	if e.OccurredAt.IsZero() {
		e.OccurredAt = time.Now()
	}
	e.OccurredAt = e.OccurredAt.UTC()
	e.Sequence = 0 // the database assigns it
	body, err := json.Marshal(e)
	if err != nil {
		return "", nil, fmt.Errorf("outbox: encode %s: %w", e.Type, err)
	}
	if e.AggregateID == "" {
		return `INSERT INTO outbox (id, tenant_id, aggregate_id, type, payload, occurred_at, traceparent)
			 SELECT ?, ?, ?, ?, ?, ?, ?`,
			[]any{e.ID, e.TenantID, e.AggregateID, e.Type, string(body), e.OccurredAt, traceparent}, nil
	}
	// Sequence is Event's last field, omitted while zero: the body with it
	// is the body without it, its closing brace replaced by
	// ,"sequence":N} — what json.Marshal would give, byte for byte. The
	// aggregate's next number comes from outbox_next_seq (migration 00004).
	return `INSERT INTO outbox (id, tenant_id, aggregate_id, aggregate_seq, type, payload, occurred_at, traceparent)
			 SELECT ?, ?, ?, s.n, ?, (? || s.n || '}')::json, ?, ?
			 FROM (SELECT outbox_next_seq(?) AS n) s`,
		[]any{e.ID, e.TenantID, e.AggregateID, e.Type, string(body[:len(body)-1]) + `,"sequence":`, e.OccurredAt, traceparent, e.AggregateID}, nil
}
