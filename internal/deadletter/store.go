package deadletter

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
)

// record writes l, inside tx: a new unresolved row, or, when (Queue,
// MessageID) already has one, that row with Times incremented and the
// latest reason, error, failures and headers. It reports whether the row
// is new. Commit makes it durable; rollback forgets it, so the dead-letter
// queue's redelivery records it again.
func record(ctx context.Context, tx *gorm.DB, l Letter, now time.Time) (first bool, err error) {
	var inserted bool
	err = tx.WithContext(ctx).Raw(`INSERT INTO dead_letters
		(id, queue, message_id, routing_key, content_type, reason, last_error, failures, headers, body, first_dead_at, last_dead_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (queue, message_id) WHERE redriven_at IS NULL DO UPDATE SET
			times = dead_letters.times + 1, reason = EXCLUDED.reason, last_error = EXCLUDED.last_error,
			failures = EXCLUDED.failures, headers = EXCLUDED.headers, last_dead_at = EXCLUDED.last_dead_at
		RETURNING xmax = 0`,
		ids.New("dlt"), l.Queue, l.MessageID, l.RoutingKey, l.ContentType, string(l.Reason), l.LastError, l.Failures,
		string(l.Headers), l.Body, now, now).Row().Scan(&inserted)
	if err != nil {
		return false, fmt.Errorf("deadletter: record %s from %s: %w", l.MessageID, l.Queue, err)
	}
	return inserted, nil
}

// Filter selects unresolved dead letters; its zero value selects all.
type Filter struct {
	// ID selects one row by its id.
	ID string
	// MessageID selects the rows of one message id (event id).
	MessageID string
}

// Unresolved returns the unresolved dead letters f selects, oldest first.
func Unresolved(ctx context.Context, db *gorm.DB, f Filter) ([]Letter, error) {
	q := db.WithContext(ctx).Table("dead_letters").Where("redriven_at IS NULL")
	if f.ID != "" {
		q = q.Where("id = ?", f.ID)
	}
	if f.MessageID != "" {
		q = q.Where("message_id = ?", f.MessageID)
	}
	var rows []Letter
	if err := q.Order("first_dead_at, id").Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("deadletter: list unresolved: %w", err)
	}
	return rows, nil
}

// markRedriven sets redriven_at of the unresolved row id to now. It
// reports false if the row was resolved meanwhile (another redrive).
func markRedriven(ctx context.Context, db *gorm.DB, id string, now time.Time) (bool, error) {
	res := db.WithContext(ctx).Exec(`UPDATE dead_letters SET redriven_at = ? WHERE id = ? AND redriven_at IS NULL`, now, id)
	if res.Error != nil {
		return false, fmt.Errorf("deadletter: mark %s redriven: %w", id, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// CountUnresolved returns how many dead letters are unresolved.
func CountUnresolved(ctx context.Context, db *gorm.DB) (int64, error) {
	var n int64
	if err := db.WithContext(ctx).Raw(`SELECT count(*) FROM dead_letters WHERE redriven_at IS NULL`).Scan(&n).Error; err != nil {
		return 0, fmt.Errorf("deadletter: count unresolved: %w", err)
	}
	return n, nil
}
