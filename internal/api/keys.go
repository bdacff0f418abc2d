package api

import (
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/refunds"
)

// Completer returns what resumes the unfinished keys of every route the API
// guards with an Idempotency-Key (CONTRACT.md v3: every route that takes a
// key is resumed by the completer): the checkout and its cancellation
// through checkouts' Commands, the refund through refunds', each run by one
// idempotency.Executor on the key store of checkouts. Every process that
// completes keys builds its completer with it (cmd/worker), so that no
// route is left out of one of them; the test
// TestEveryKeyedRouteHasACompleter holds it to the routes API.KeyRoutes
// lists.
func Completer(db *gorm.DB, checkouts *checkout.Service, refundSvc *refunds.Service) *idempotency.Resumer {
	return &idempotency.Resumer{
		Executor: &idempotency.Executor{Store: checkouts.Keys, DB: db, Logger: checkouts.Logger},
		Commands: checkouts.Commands().Merge(refundSvc.Commands()),
	}
}
