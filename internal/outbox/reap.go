package outbox

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Reap deletes at most limit outbox rows published before publishedBefore,
// the oldest first, in one statement on db (its own transaction unless db is
// one), and returns how many it deleted. A caller that wants everything past
// retention gone calls it until it returns fewer than limit.
//
// An unpublished row is never deleted, whatever its age: it still has to
// reach the broker. Rows another transaction holds (the relay marking them)
// are skipped (FOR UPDATE SKIP LOCKED), not waited for, and FOR UPDATE
// rechecks published_at on the row's latest version. The error wraps the
// database's.
func Reap(ctx context.Context, db *gorm.DB, publishedBefore time.Time, limit int) (deleted int64, err error) {
	// The batch is picked by the outbox_published partial index; the
	// constant condition is a literal so the planner matches it whatever
	// the plan cache does.
	res := db.WithContext(ctx).Exec(`
		DELETE FROM outbox WHERE id = ANY(ARRAY(
		  SELECT id FROM outbox
		  WHERE published_at IS NOT NULL AND published_at < ?
		  ORDER BY published_at LIMIT ? FOR UPDATE SKIP LOCKED))`,
		publishedBefore, limit)
	if res.Error != nil {
		return 0, fmt.Errorf("outbox: delete old published rows: %w", res.Error)
	}
	return res.RowsAffected, nil
}
