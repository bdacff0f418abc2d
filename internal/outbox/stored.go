package outbox

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/tracing"
)

// Stored is one outbox row as the relay sees it: an event and how its
// publication went.
type Stored struct {
	// ID is the event id, the AMQP message_id.
	ID string
	// Type is the routing key, e.g. TypeOrderPaid.
	Type string
	// Sequence is the event's number within its aggregate (Event.Sequence),
	// 0 for an event without an aggregate.
	Sequence int64
	// PublishedAt is when the relay marked the row published (the broker
	// confirmed it), nil while it waits.
	PublishedAt *time.Time
	// Attempts is the number of failed publishes.
	Attempts int
	// Payload is the message body as published, byte for byte (the JSON
	// form of Event).
	Payload []byte
}

// ForAggregate returns the events of aggregateID (e.g. an order id) that the
// outbox still holds, in the order they were written; Reap removes
// published ones past retention, so an old aggregate may have none. It only
// reads, for inspection (cmd/demo): consumers get events from the broker.
// The error wraps the database's.
func ForAggregate(ctx context.Context, db *gorm.DB, aggregateID string) ([]Stored, error) {
	rs, err := db.WithContext(ctx).Raw(`
		SELECT id, type, coalesce(aggregate_seq, 0), published_at, attempts, payload::text
		FROM outbox WHERE aggregate_id = ? ORDER BY seq`, aggregateID).Rows()
	if err != nil {
		return nil, fmt.Errorf("outbox: events of %s: %w", aggregateID, err)
	}
	defer rs.Close()
	var out []Stored
	for rs.Next() {
		var s Stored
		if err := rs.Scan(&s.ID, &s.Type, &s.Sequence, &s.PublishedAt, &s.Attempts, &s.Payload); err != nil {
			return nil, fmt.Errorf("outbox: events of %s: %w", aggregateID, err)
		}
		out = append(out, s)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: events of %s: %w", aggregateID, err)
	}
	return out, nil
}

// TraceParentOf returns the traceparent stored with the first event of
// aggregateID that has one (the order's checkout trace), or "" when tracing
// is off or the outbox holds none (Reap removed them). The webhook and the
// completer link their spans to it (tracing.LinkTo). The error wraps the
// database's.
func TraceParentOf(ctx context.Context, db *gorm.DB, aggregateID string) (string, error) {
	if !tracing.Enabled() {
		return "", nil
	}
	var tp []string
	if err := db.WithContext(ctx).Raw(`SELECT traceparent FROM outbox
		WHERE aggregate_id = ? AND traceparent IS NOT NULL ORDER BY seq LIMIT 1`, aggregateID).Scan(&tp).Error; err != nil {
		return "", fmt.Errorf("outbox: trace of %s: %w", aggregateID, err)
	}
	if len(tp) == 0 {
		return "", nil
	}
	return tp[0], nil
}
