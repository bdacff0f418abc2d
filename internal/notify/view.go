package notify

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// View is one notification's delivery state as GET /v1/orders/{id} shows
// it (CONTRACT.md): {"channel","kind","status","sent_at"}.
type View struct {
	// Channel is ChannelEmail.
	Channel string `json:"channel"`
	// Kind is what it is about: KindOrderPaid, or KindOrderRefunded (one
	// per succeeded refund).
	Kind string `json:"kind"`
	// Status is pending, sending, sent or failed.
	Status string `json:"status"`
	// SentAt is when the SMTP server accepted the email (UTC), null until
	// then.
	SentAt *time.Time `json:"sent_at"`
}

// ForOrder returns the notifications of order orderID, by channel and then
// in the order of the events they are about, read on db (a transaction's
// snapshot if db is one). An order without any gets an empty, non-nil
// slice, so its JSON is []. The error wraps the database's.
func ForOrder(ctx context.Context, db *gorm.DB, orderID string) ([]View, error) {
	vs := []View{}
	err := db.WithContext(ctx).Raw(`
		SELECT channel, kind, status, sent_at FROM notifications WHERE order_id = ?
		ORDER BY channel, coalesce(event_seq, 0), created_at`, orderID).
		Scan(&vs).Error
	if err != nil {
		return nil, fmt.Errorf("load notifications of %s: %w", orderID, err)
	}
	for i := range vs {
		if vs[i].SentAt != nil {
			t := vs[i].SentAt.UTC()
			vs[i].SentAt = &t
		}
	}
	return vs, nil
}
