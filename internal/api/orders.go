package api

import (
	"context"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/refunds"
)

// OrderView is an order with its refunds and notifications, as GET
// /v1/orders/{id} returns it: the one place that joins the three owners'
// queries (checkout.Service.Order, refunds.ForOrder, notify.ForOrder).
type OrderView struct {
	*orders.Order
	// AmountRefunded is the sum of the order's succeeded refunds, in minor
	// units of the order's currency.
	AmountRefunded int64            `json:"amount_refunded"`
	Refunds        []refunds.Refund `json:"refunds"`
	Notifications  []notify.View    `json:"notifications"`
}

// errViewUnavailable is a GET order view whose refunds or notifications
// could not be read (503, with the code's Retry-After).
var errViewUnavailable = problem.New(problem.CodeUnavailable, "A dependency is unavailable. Retry the request.")

// orderView returns tenant's order id with its refunds and notifications,
// or checkout.ErrOrderNotFound (404), or a coded unavailable error.
func orderView(ctx context.Context, svc *checkout.Service, db *gorm.DB, tenantID, id string) (*OrderView, error) {
	o, err := svc.Order(ctx, tenantID, id)
	if err != nil {
		return nil, err
	}
	ns, err := notify.ForOrder(ctx, db, id)
	if err != nil {
		return nil, problem.Wrap(errViewUnavailable, err)
	}
	rs, err := refunds.ForOrder(ctx, db, id)
	if err != nil {
		return nil, problem.Wrap(errViewUnavailable, err)
	}
	var refunded int64
	for _, r := range rs {
		if r.Status == refunds.StatusSucceeded {
			refunded += r.Amount
		}
	}
	return &OrderView{Order: o, AmountRefunded: refunded, Refunds: rs, Notifications: ns}, nil
}
