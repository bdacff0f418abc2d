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
	return s.apply(ctx, r, pi)
}

// ApplyPaymentIntent applies Stripe's state of PaymentIntent pi to the
// order named by its metadata (order_id, tenant_id): succeeded makes it
// paid; requires_action makes it requires_action (with next_action and
// client_secret); requires_payment_method after a failed attempt (a
// decline, a failed 3D Secure) makes it payment_failed with its stock
// released; canceled makes it canceled (when the customer asked) or
// payment_failed. Every change is monotonic (a status never goes back), so
// applying the same or an older state again changes nothing, in any order,
// from any process. It reports whether the order changed.
//
// A change that leaves the way to paid is applied only after the
// PaymentIntent is canceled at Stripe (closeBeforeExit), which this does
// first, outside the transaction; Stripe refusing because it succeeded
// meanwhile makes the order paid instead.
//
// PaymentIntents that are not the order's recorded one (orphans of an
// indeterminate create, or not ours at all) change nothing; one of them
// moving money, or the order's own for an order that failed, is a stray
// payment: refunded and counted (SettleStrayPayment). The reconciler uses
// it; the webhook handler uses CloseBeforeExit, SettleStrayPayment and
// ApplyPaymentIntentTx.
func (s *Service) ApplyPaymentIntent(ctx context.Context, pi PaymentIntentState) (bool, error) {
	o, err := orderOfIntent(ctx, s.DB, pi)
	if errors.Is(err, ErrOrderNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return s.apply(ctx, s.newRun(nil, "", o), pi)
}

// orderOfIntent loads the order PaymentIntent pi names in its metadata
// (order_id, tenant_id, which every PaymentIntent the service creates
// carries), through db. It returns ErrOrderNotFound when the metadata names
// none, or an order that does not exist for that tenant.
func orderOfIntent(ctx context.Context, db *gorm.DB, pi PaymentIntentState) (*Order, error) {
	id, tenant := pi.Metadata["order_id"], pi.Metadata["tenant_id"]
	if !ids.Valid("ord", id) || tenant == "" {
		return nil, ErrOrderNotFound
	}
	return loadOrder(ctx, db, tenant, id)
}

// apply applies pi to the order of r, without a key.
func (s *Service) apply(ctx context.Context, r *run, pi PaymentIntentState) (bool, error) {
	o := r.o
	if isStray(o, pi) {
		return false, s.settleStray(ctx, o, pi)
	}
	if o.Payment.PaymentIntentID != pi.ID {
		return false, nil
	}
	ch, ok, err := r.changeOf(ctx, &verdict{pi: &pi})
	if err != nil || !ok {
		return false, err
	}
	if ch, err = r.closeBeforeExit(ctx, ch); err != nil {
		return false, err
	}
	var changed bool
	err = postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		changed, err = s.applyTx(ctx, tx, o, ch, r.now())
		return err
	})
	return changed, err
}

// CloseBeforeExit prepares Stripe's state pi of an order's PaymentIntent
// for ApplyPaymentIntentTx, outside any transaction: when pi is the order's
// PaymentIntent, still open, and its state would take the order off the
// way to paid (a failed attempt: requires_payment_method with a
// last_payment_error), it cancels the PaymentIntent at Stripe first
// (cancellation_reason abandoned) and returns its state afterwards:
// canceled, with the failed attempt's codes, which fails the order, or
// succeeded, when it was paid meanwhile (another card, a rolled-forward
// confirm), which makes the order paid. Any other pi is returned as it is.
// An error means Stripe or the database did not answer, and nothing was
// applied. See closeBeforeExit for why.
func (s *Service) CloseBeforeExit(ctx context.Context, pi PaymentIntentState) (PaymentIntentState, error) {
	if pi.Status == stripeintent.Canceled || pi.Status.MovesMoney() {
		return pi, nil
	}
	o, err := orderOfIntent(ctx, s.DB, pi)
	switch {
	case errors.Is(err, ErrOrderNotFound):
		return pi, nil
	case err != nil:
		return pi, err
	case o.Payment.PaymentIntentID != pi.ID:
		return pi, nil
	}
	r := s.newRun(nil, "", o)
	ch, ok := r.changeFor(pi, "")
	if !ok || !ch.To.LeavesTheWayToPaid() || !o.Status.CanMoveTo(ch.To) {
		return pi, nil
	}
	got, err := r.cancel(ctx, pi.ID, CancelAbandoned, ch.FailureCode)
	if err != nil {
		return pi, fmt.Errorf("close the payment of order %s: %w", o.ID, err)
	}
	if got.Status == stripeintent.Canceled && !failedAttempt(got) {
		got.LastErrorCode, got.LastDeclineCode = pi.LastErrorCode, pi.LastDeclineCode
	}
	return got, nil
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
