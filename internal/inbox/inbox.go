// Package inbox implements the idempotent consumer pattern
// (https://microservices.io/patterns/communication-style/idempotent-consumer.html):
// a consumer records each message id in the same transaction as the state
// change the message causes, so a redelivered or re-published message
// changes nothing.
package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
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
	query, args := recordStatement(consumer, []string{messageID})
	res := tx.WithContext(ctx).Exec(query, args...)
	if res.Error != nil {
		return false, fmt.Errorf("inbox: record %s/%s: %w", consumer, messageID, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// Recorded is what QueueRecord recorded, once its batch is sent.
type Recorded struct {
	// First holds the message ids recorded for the first time: the
	// caller's state change is due for them, and for no other.
	First map[string]bool
}

// QueueRecord queues in b what Record does, for every one of messageIDs at
// once: a row for each id that is new, none for a duplicate. Once b is
// sent without error, the returned Recorded says which were new. The same
// rules as Record's hold: b must write the state changes of the new ones.
func QueueRecord(b *postgres.Batch, consumer string, messageIDs []string) *Recorded {
	rec := &Recorded{}
	insert, args := recordStatement(consumer, messageIDs)
	var ids []byte
	b.Queue(`WITH r AS (`+insert+` RETURNING message_id) SELECT coalesce(json_agg(message_id), '[]') FROM r`,
		args, func(r pgx.Row) error { return r.Scan(&ids) })
	b.AfterCommit(func() {
		var first []string
		_ = json.Unmarshal(ids, &first) // json_agg of text: always a list of strings
		rec.First = make(map[string]bool, len(first))
		for _, id := range first {
			rec.First[id] = true
		}
	})
	return rec
}

// recordStatement is the INSERT of consumer's messageIDs, one parameter
// each (a list of values, not one array, so that pgbench's script of the
// worker can send the same statement), that skips the ones recorded.
func recordStatement(consumer string, messageIDs []string) (string, []any) {
	var sb strings.Builder
	sb.WriteString(`INSERT INTO inbox (consumer, message_id) SELECT ?, m.id FROM (VALUES `)
	args := make([]any, 0, len(messageIDs)+1)
	args = append(args, consumer)
	for i, id := range messageIDs {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("(?::text)")
		args = append(args, id)
	}
	sb.WriteString(`) AS m (id) ON CONFLICT DO NOTHING`)
	return sb.String(), args
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
