package api

import (
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/sweep"
)

// Completer returns what resumes the unfinished keys of every route the API
// guards with an Idempotency-Key (CONTRACT.md v3: every route that takes a
// key is resumed by the completer): the checkout and its cancellation
// through checkouts, the refund through refunds, each key handed over by
// its route. Every process that completes keys builds its completer with
// it (cmd/worker), so that no route is left out of one of them; the test
// TestEveryKeyedRouteHasACompleter holds it to the routes API.KeyRoutes
// lists.
func Completer(db *gorm.DB, checkouts *checkout.Service, refundSvc *refunds.Service) sweep.ByRoute {
	return sweep.NewByRoute(db, checkouts, refundSvc)
}
