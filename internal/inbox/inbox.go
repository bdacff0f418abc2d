// Package inbox implements the idempotent consumer pattern
// (https://microservices.io/patterns/communication-style/idempotent-consumer.html):
// a consumer records each message id in the same transaction as the state
// change the message causes, so a redelivered or re-published message
// changes nothing.
package inbox

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// Record notes that consumer has processed messageID, inside tx.
//
// first is true when this is the first time: the caller goes on with its
// state change in the same tx. first is false for a duplicate: the caller
// changes nothing and acknowledges the message. Commit makes the record and
// the state change durable together; rollback forgets both, so the
// redelivery is processed again. A concurrent transaction recording the same
// pair makes Record wait until that one commits (then first is false) or
// rolls back (then first is true).
func Record(ctx context.Context, tx *gorm.DB, consumer, messageID string) (first bool, err error) {
	if consumer == "" || messageID == "" {
		return false, fmt.Errorf("inbox: consumer and message id are required")
	}
	query, args := StatementFrom(consumer, "(VALUES (?::text)) AS m (message_id)")
	res := tx.WithContext(ctx).Exec(query, append(args, messageID)...)
	if res.Error != nil {
		return false, fmt.Errorf("inbox: record %s/%s: %w", consumer, messageID, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// StatementFrom returns Record's INSERT for many messages at once, and its
// argument, for a consumer that records a batch inside a larger statement of
// its transaction (data-modifying CTEs) to save round trips: it inserts a
// row for each message_id of the relation from (a CTE of the caller's with
// a message_id column) that is new, none for a duplicate, and ends with its
// ON CONFLICT clause, so the caller may add "RETURNING message_id" to learn
// which were new. The same rules as Record's hold.
func StatementFrom(consumer, from string) (string, []any) {
	return `INSERT INTO inbox (consumer, message_id) SELECT ?, message_id FROM ` + from + ` ON CONFLICT DO NOTHING`,
		[]any{consumer}
}

// Seen reports whether consumer has recorded messageID already, as of a
// read on db (a transaction's snapshot if db is one). It is a shortcut only,
// e.g. to skip a remote call for a redelivery: a concurrent Record may
// commit right after, so Record's first, not Seen, decides whether a
// message is processed. A row Reap deleted is not seen. The error wraps the
// database's.
func Seen(ctx context.Context, db *gorm.DB, consumer, messageID string) (bool, error) {
	var seen bool
	err := db.WithContext(ctx).Raw(`SELECT EXISTS (SELECT 1 FROM inbox WHERE consumer = ? AND message_id = ?)`,
		consumer, messageID).Scan(&seen).Error
	if err != nil {
		return false, fmt.Errorf("inbox: look up %s/%s: %w", consumer, messageID, err)
	}
	return seen, nil
}
