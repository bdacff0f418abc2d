package inbox

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Reap deletes at most limit inbox rows received before receivedBefore, the
// oldest first, in one statement on db (its own transaction unless db is
// one), and returns how many it deleted. A caller that wants everything past
// retention gone calls it until it returns fewer than limit.
//
// A message redelivered after its row is gone is processed again, so
// receivedBefore must lie further back than the longest redelivery delay of
// the broker and the outbox relay. Rows another transaction holds are
// skipped (FOR UPDATE SKIP LOCKED), not waited for: Reap never blocks a
// consumer, and several reapers share the work. The error wraps the
// database's.
func Reap(ctx context.Context, db *gorm.DB, receivedBefore time.Time, limit int) (deleted int64, err error) {
	// The batch is picked by the inbox_received index. Inbox rows are never
	// updated, so their ctid is stable; it makes the delete a TID scan.
	res := db.WithContext(ctx).Exec(`
		DELETE FROM inbox WHERE ctid = ANY(ARRAY(
		  SELECT ctid FROM inbox
		  WHERE received_at < ?
		  ORDER BY received_at LIMIT ? FOR UPDATE SKIP LOCKED))`,
		receivedBefore, limit)
	if res.Error != nil {
		return 0, fmt.Errorf("inbox: delete old rows: %w", res.Error)
	}
	return res.RowsAffected, nil
}
