package notify

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// Requeue makes failed notifications due again, so that a running sender
// sends them at its next sweep (NOTIFY_SWEEP_INTERVAL): every failed
// notification, or only those of order orderID when it is not empty. It
// returns how many it requeued; 0 when none was failed (a sent, pending or
// sending notification is left alone, so requeueing twice sends nothing
// twice).
//
// The email goes with its notification's Message-ID, as on every try.
// failing_since is cleared, so a requeued notification whose sends fail
// temporarily again is retried for a whole RetryFor; attempts is kept, as
// the claim that a sender may still hold on a row it lost compares it.
// `worker requeue-notifications [-order ID]` calls it.
func Requeue(ctx context.Context, db *gorm.DB, orderID string) (int, error) {
	q := db.WithContext(ctx).Table("notifications").Where("status = 'failed'")
	if orderID != "" {
		q = q.Where("order_id = ?", orderID)
	}
	res := q.Updates(map[string]any{
		"status":          "pending",
		"next_attempt_at": gorm.Expr("now()"),
		"failing_since":   nil,
		"claimed_until":   nil,
	})
	if res.Error != nil {
		return 0, fmt.Errorf("notify: requeue failed notifications: %w", res.Error)
	}
	return int(res.RowsAffected), nil
}
