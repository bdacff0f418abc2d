package outbox

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
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
