package maintenance

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// ByRoute is a KeyCompleter that hands each key to the KeyCompleter of its
// route (idempotency_keys.route, e.g. "POST /v1/checkouts"), read before
// anything takes the key over, so that no completer ever takes over (and
// commits a new lease on) a key whose route it does not handle. A key of
// another route is skipped: (false, nil).
type ByRoute struct {
	DB     *gorm.DB
	Routes map[string]KeyCompleter
}

var _ KeyCompleter = ByRoute{}

// Complete completes key id with its route's KeyCompleter.
func (b ByRoute) Complete(ctx context.Context, keyID int64) (bool, error) {
	var routes []string
	if err := b.DB.WithContext(ctx).Raw(`SELECT route FROM idempotency_keys WHERE id = ?`, keyID).Scan(&routes).Error; err != nil {
		return false, fmt.Errorf("route of key %d: %w", keyID, err)
	}
	if len(routes) == 0 {
		return false, nil // reaped meanwhile
	}
	c, ok := b.Routes[routes[0]]
	if !ok {
		return false, nil
	}
	return c.Complete(ctx, keyID)
}
