package checkout

import (
	"context"
	"errors"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/orders"
)

// CancelCommand is one POST /v1/orders/{id}/cancel as the gateway admitted
// it.
type CancelCommand struct {
	// Tenant and IdempotencyKey name the key (its route is CancelRoute).
	Tenant, IdempotencyKey string
	// Fingerprint is the request's fingerprint; Owner its lease token.
	Fingerprint, Owner string
	// OrderID is the order to cancel.
	OrderID string
}

// CancelOrder cancels an order in requires_action: its PaymentIntent is
// canceled at Stripe (cancellation_reason requested_by_customer), its stock
// released, its status canceled and order.canceled written to the outbox
// (CONTRACT.md, "3D Secure").
//
// It returns the final response, stored under the key: 200 with the order,
// or 409 order_not_cancelable when the order is in any other status
// (including one the customer reached meanwhile: a PaymentIntent that
// succeeded before the cancellation makes the order paid, and the answer
// 409; and a cancellation under another key that got there first makes it
// 409 too). Errors, not stored: ErrOrderNotFound (404), the idempotency layer's
// 409 and 422, payment_provider_unavailable (502) and unavailable (503).
func (s *Service) CancelOrder(ctx context.Context, cmd CancelCommand) (resp *idempotency.Response, replayed bool, err error) {
	if !ids.Valid("ord", cmd.OrderID) {
		return nil, false, ErrOrderNotFound
	}
	scope := idempotency.Scope{Tenant: cmd.Tenant, Route: CancelRoute, Key: cmd.IdempotencyKey}
	resp, replayed, err = s.executor().Execute(ctx, scope, cmd.Fingerprint, cmd.Owner, &cancellation{s: s, orderID: cmd.OrderID})
	if err != nil {
		return nil, false, s.translate(err)
	}
	return resp, replayed, nil
}

// cancellation is one execution of a cancellation (CancelRoute) as an
// idempotency.Command.
type cancellation struct {
	s *Service
	// orderID is the order a new key cancels.
	orderID string
	// order is the order, as Start or Resume loaded it.
	order *orders.Order
}

// Start locks the order and, when it is in requires_action and no other
// key is canceling it, advances the key to cancel_requested; otherwise it
// finishes the key with the stored 409 order_not_cancelable. A missing
// order rolls the claim back: 404, nothing stored.
func (x *cancellation) Start(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (*idempotency.Response, error) {
	// Cancellations of one order under different keys take turns on
	// its row: the first to get past here cancels it, and the others
	// answer as for an order no longer cancelable.
	if err := orders.Lock(ctx, tx, c.Scope.Tenant, x.orderID); errors.Is(err, orders.ErrNotFound) {
		return nil, ErrOrderNotFound
	} else if err != nil {
		return nil, err
	}
	o, err := loadOrder(ctx, tx, c.Scope.Tenant, x.orderID)
	if err != nil {
		return nil, err
	}
	x.order = o
	if o.Status != orders.RequiresAction {
		final := notCancelable(o)
		return final, x.s.Keys.Finish(ctx, tx, c, final)
	}
	taken, err := x.s.Keys.OrderTaken(ctx, tx, c, o.ID)
	if err != nil {
		return nil, err
	}
	if taken {
		final := responseForError(notCancelableError(
			"The order is being canceled under another Idempotency-Key; only one cancellation cancels it."))
		return final, x.s.Keys.Finish(ctx, tx, c, final)
	}
	return nil, x.s.Keys.Advance(ctx, tx, c, RecoveryPointCancelRequested, o.ID)
}

// Resume loads the order of a key taken over at cancel_requested.
func (x *cancellation) Resume(ctx context.Context, tx *gorm.DB, c *idempotency.Claim) (err error) {
	x.order, err = x.s.resumedOrder(ctx, tx, c)
	return err
}

// Run is the saga of a cancellation after its key reached
// cancel_requested: cancel the PaymentIntent, apply Stripe's answer, finish
// the key.
func (x *cancellation) Run(ctx context.Context, c *idempotency.Claim) (*idempotency.Response, error) {
	o := x.order
	r := x.s.newRun(c, CancelRoute, o)
	if o.Status != orders.RequiresAction || o.Payment.PaymentIntentID == "" {
		return r.settle(ctx, nil)
	}
	pi, err := r.cancel(ctx, o.Payment.PaymentIntentID, CancelRequestedByCustomer, FailureCanceled)
	if err != nil {
		return r.stop(ctx, err)
	}
	return r.settle(ctx, &verdict{pi: &pi})
}
