package sweep

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// RouteCompleter is a KeyCompleter that names the routes whose keys it
// resumes (idempotency_keys.route, e.g. "POST /v1/checkouts"), the same
// routes its Complete takes over.
type RouteCompleter interface {
	KeyCompleter
	KeyRoutes() []string
}

// ByRoute is a KeyCompleter that hands each key to the KeyCompleter of its
// route (idempotency_keys.route, e.g. "POST /v1/checkouts"), read before
// anything takes the key over, so that no completer ever takes over (and
// commits a new lease on) a key whose route it does not handle. A key of
// another route is skipped: (false, nil). Build it with NewByRoute, so that
// the routes are the ones each completer says it resumes.
type ByRoute struct {
	DB     *gorm.DB
	Routes map[string]KeyCompleter
}

var _ KeyCompleter = ByRoute{}

// NewByRoute returns a ByRoute that hands each route of each completer's
// KeyRoutes to that completer. Two completers naming the same route is a
// wiring mistake: it panics.
func NewByRoute(db *gorm.DB, completers ...RouteCompleter) ByRoute {
	b := ByRoute{DB: db, Routes: map[string]KeyCompleter{}}
	for _, c := range completers {
		for _, route := range c.KeyRoutes() {
			if _, dup := b.Routes[route]; dup {
				panic(fmt.Sprintf("sweep: two completers for route %q", route))
			}
			b.Routes[route] = c
		}
	}
	return b
}

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
