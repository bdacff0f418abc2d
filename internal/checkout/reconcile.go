package checkout

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripeintent"
)

// ReconcileOrder asks Stripe for the state of the PaymentIntent of tenant's
// order id, which waits in requires_action (the customer's 3D Secure
// challenge), and applies it: paid, payment_failed, or still waiting. An
// order still in requires_action PAYMENT_ACTION_TIMEOUT after it entered it
// has its PaymentIntent canceled (reason abandoned), whatever the
// PaymentIntent's status short of moving money, its stock released and
// becomes payment_failed. It reports whether the order changed. Orders in
// other statuses are left alone (false): those with an unfinished key are
// resumed with Complete. The reconciler calls it.
func (s *Service) ReconcileOrder(ctx context.Context, tenantID, id string) (bool, error) {
	o, err := loadOrder(ctx, s.DB, tenantID, id)
	if err != nil {
		return false, err
	}
	if o.Status != orders.RequiresAction || o.Payment.PaymentIntentID == "" {
		return false, nil
	}
	r := s.newRun(nil, "", o)
	pi, err := s.Payments.RetrievePaymentIntent(ctx, o.Payment.PaymentIntentID)
	if err != nil {
		return false, fmt.Errorf("reconcile order %s: %w", id, err)
	}
	// Whatever the PaymentIntent's status, as long as Stripe could still
	// move money with it (requires_action, requires_payment_method,
	// requires_confirmation: the customer's browser may have attached
	// another payment method and stopped): only a cancel ends the wait.
	if pi.Status.Cancelable() && !pi.Status.MovesMoney() && o.RequiresActionAt != nil &&
		!s.Now().Before(o.RequiresActionAt.Add(r.cfg.ActionTimeout)) {
		s.Logger.InfoContext(ctx, "the customer did not complete the payment's next action in time; canceling",
			"order_id", id, "payment_intent", pi.ID, "since", o.RequiresActionAt)
		if pi, err = r.cancel(ctx, pi.ID, CancelAbandoned, FailureActionTimeout); err != nil {
			return false, fmt.Errorf("cancel abandoned payment of order %s: %w", id, err)
		}
	}
	return s.applyPaymentIntent(ctx, r, pi, nil)
}

// ErrStripeStep is wrapped by ApplyPaymentIntent's error when a call to
// Stripe it makes before its transaction (closing the order's
// PaymentIntent, refunding a stray payment) got no usable answer: nothing
// was applied or recorded, and applying the same state again later is safe.
var ErrStripeStep = errors.New("a call to Stripe got no usable answer")

// ApplyPaymentIntent applies Stripe's state of PaymentIntent pi to the
// order named by its metadata (order_id, tenant_id): the one "apply
// Stripe's state of a PaymentIntent" of the webhook handler and the
// reconciler. succeeded makes the order paid; requires_action makes it
// requires_action (with next_action and client_secret);
// requires_payment_method after a failed attempt (a decline, a failed 3D
// Secure) makes it payment_failed with its stock released; canceled makes
// it canceled (when the customer asked) or payment_failed. Every change is
// monotonic (a status never goes back), so applying the same or an older
// state again changes nothing, in any order, from any process. It reports
// whether the order changed.
//
// Before its transaction, outside it, it does what needs Stripe: a change
// that leaves the way to paid is applied only after the PaymentIntent is
// canceled at Stripe (closeBeforeExit; Stripe refusing because it
// succeeded meanwhile makes the order paid instead), and a PaymentIntent
// that moves money for an order that is not paid is a stray payment,
// refunded and counted (settleStray) and applied nowhere. A PaymentIntent
// that is not the order's recorded one (an orphan of an indeterminate
// create) changes nothing.
//
// record, when not nil, runs first inside the transaction that applies the
// change: the webhook handler records its event in its inbox there, so that
// commit makes the record, the order's orders.Change, its stock release and
// its event durable together, and rollback forgets all of them. When record
// returns false (the event was recorded before: a redelivery), nothing is
// applied and ApplyPaymentIntent returns false. It returns ErrOrderNotFound
// when pi's metadata names no order of the tenant (record is not called),
// an error wrapping ErrStripeStep when Stripe did not answer a call it
// made, and any other error when the database failed.
func (s *Service) ApplyPaymentIntent(ctx context.Context, pi PaymentIntentState, record func(tx *gorm.DB) (first bool, err error)) (bool, error) {
	o, err := orderOfIntent(ctx, s.DB, pi)
	if err != nil {
		return false, err
	}
	return s.applyPaymentIntent(ctx, s.newRun(nil, "", o), pi, record)
}

// orderOfIntent loads the order PaymentIntent pi names in its metadata
// (order_id, tenant_id, which every PaymentIntent the service creates
// carries), through db. It returns ErrOrderNotFound when the metadata names
// none, or an order that does not exist for that tenant.
func orderOfIntent(ctx context.Context, db *gorm.DB, pi PaymentIntentState) (*orders.Order, error) {
	id, tenant := pi.Metadata["order_id"], pi.Metadata["tenant_id"]
	if !ids.Valid("ord", id) || tenant == "" {
		return nil, ErrOrderNotFound
	}
	return loadOrder(ctx, db, tenant, id)
}

// applyPaymentIntent is ApplyPaymentIntent for the order of r, without a
// key.
func (s *Service) applyPaymentIntent(ctx context.Context, r *run, pi PaymentIntentState, record func(tx *gorm.DB) (bool, error)) (bool, error) {
	o := r.o
	var ch orders.Change
	apply := false
	switch {
	case isStray(o, pi):
		if err := s.settleStray(ctx, o, pi); err != nil {
			return false, fmt.Errorf("settle stray payment %s: %w: %w", pi.ID, ErrStripeStep, err)
		}
	case o.Payment.PaymentIntentID != pi.ID:
		// Not the order's: an orphan (the sweep cancels it), or one the
		// saga has not recorded yet (it adopts what it finds).
	default:
		var err error
		if ch, apply, err = r.changeForVerdict(ctx, &verdict{pi: &pi}); err != nil {
			return false, err
		}
		if apply {
			if ch, err = r.closeBeforeExit(ctx, ch); err != nil {
				return false, fmt.Errorf("%w: %w", ErrStripeStep, err)
			}
		}
	}
	if !apply && record == nil {
		return false, nil
	}
	var changed bool
	err := postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		if record != nil {
			if first, err := record(tx); err != nil || !first {
				return err
			}
		}
		if !apply {
			return nil
		}
		var err error
		changed, err = s.applyChange(ctx, tx, o, ch, r.now())
		return err
	})
	return changed, err
}

// SweepOrphans searches Stripe for the PaymentIntents of tenant's order id
// (metadata['order_id']) and cancels, with cancellation_reason duplicate,
// every one that is not the order's and moves no money: what a create
// answered with a 500 and rolled forward by Stripe after the saga's own
// search left behind. They were never confirmed, so they moved nothing;
// canceling them keeps CONTRACT.md's "any other PaymentIntent created for
// the order is canceled", whether or not the order recorded one (an order
// whose creates after an indeterminate one were refused failed without
// one). An order whose payment is still being worked on (pending_payment,
// payment_unknown) is left to its saga, which adopts what it finds. One
// that moves money is a stray payment (SettleStrayPayment). It returns how
// many it canceled and records the sweep on the order
// (payment_orphans_checked_at). The reconciler calls it for orders with an
// indeterminate create, every ORPHAN_SWEEP_INTERVAL for 72 hours.
func (s *Service) SweepOrphans(ctx context.Context, tenantID, id string) (int, error) {
	o, err := loadOrder(ctx, s.DB, tenantID, id)
	if err != nil {
		return 0, err
	}
	if o.Status.Pending() {
		return 0, nil
	}
	found, err := s.Payments.SearchPaymentIntents(ctx, o.ID)
	if err != nil {
		return 0, fmt.Errorf("sweep orphans of order %s: %w", id, err)
	}
	r := s.newRun(nil, "", o)
	n := 0
	for _, pi := range found {
		if isStray(o, pi) {
			if err := s.settleStray(ctx, o, pi); err != nil {
				return n, err
			}
			continue
		}
		if pi.ID == o.Payment.PaymentIntentID || !pi.Status.Cancelable() {
			continue
		}
		got, err := r.cancel(ctx, pi.ID, CancelDuplicate, "")
		if err != nil {
			return n, fmt.Errorf("cancel orphan %s of order %s: %w", pi.ID, id, err)
		}
		if got.Status == stripeintent.Canceled {
			n++
		}
	}
	if err := orders.MarkOrphansChecked(ctx, s.DB, o.ID, r.now()); err != nil {
		return n, err
	}
	if n > 0 {
		s.Logger.InfoContext(ctx, "canceled orphan PaymentIntents of an indeterminate create", "order_id", o.ID, "canceled", n)
	}
	return n, nil
}
