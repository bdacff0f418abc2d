package deadletter

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/rabbitmq"
)

// Publisher sends messages with publisher confirms and returns one error
// per message, as rabbitmq.Publisher does; Redrive's publisher sends to the
// default exchange, whose routing key is a queue's name.
type Publisher interface {
	Publish(ctx context.Context, msgs []rabbitmq.Message) []error
}

var _ Publisher = (*rabbitmq.Publisher)(nil)

// Redrive sends the unresolved dead letters f selects through their queue
// again, oldest first, each as published at first (message id, type,
// content type, body) with a fresh failure count, and marks each
// redriven once the broker confirmed it. It returns how many it sent.
//
// It is at least once and safe to repeat: a letter whose confirm or mark
// failed stays unresolved and is sent again by the next run, and the
// consumer's inbox drops a message it has already processed, so an order
// still gets one email. A letter the broker does not confirm (its queue is
// missing: ErrUnroutable) stays unresolved, and Redrive returns the first
// such error after trying the others. pub must publish to the default
// exchange (rabbitmq.PublisherConfig{Exchange: ""}).
func Redrive(ctx context.Context, db *gorm.DB, pub Publisher, f Filter, now func() time.Time) (int, error) {
	letters, err := Unresolved(ctx, db, f)
	if err != nil {
		return 0, err
	}
	if len(letters) == 0 {
		return 0, nil
	}
	msgs := make([]rabbitmq.Message, len(letters))
	for i, l := range letters {
		msgs[i] = rabbitmq.Message{
			MessageID: l.MessageID, RoutingKey: l.Queue, Type: l.RoutingKey, ContentType: l.ContentType,
			Body: l.Body, Timestamp: now(),
			// The event's routing key, which the default exchange would
			// lose; no failure count: the handler gets its tries again.
			Headers: map[string]any{rabbitmq.HeaderRoutingKey: l.RoutingKey},
		}
	}
	sent := 0
	var firstErr error
	for i, perr := range pub.Publish(ctx, msgs) {
		l := letters[i]
		if perr != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("deadletter: redrive %s (%s) to %s: %w", l.ID, l.MessageID, l.Queue, perr)
			}
			continue
		}
		if _, err := markRedriven(ctx, db, l.ID, now()); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		sent++
	}
	return sent, firstErr
}
