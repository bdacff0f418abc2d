package checkout

import (
	"context"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/stripestep"
)

// A stray payment is a PaymentIntent that moved money for an order that is
// not paid: one that is not the order's recorded PaymentIntent, or the
// recorded one of an order that failed or was canceled. The lifecycle makes
// it impossible (only the recorded PaymentIntent is ever confirmed, and an
// order leaves the way to paid only once it is closed: closeBeforeExit),
// so one seen means a bug or a Stripe incident. CONTRACT.md (v3): it is
// refunded, counted in checkout_payments_stray_total and alerted on
// (CheckoutMoneyMovedForUnpaidOrder).

// strayRefundReason is the Stripe refund reason of a stray payment's refund
// (https://docs.stripe.com/api/refunds/create#create_refund-reason).
const strayRefundReason = "duplicate"

// StrayRefundKey returns the Stripe idempotency key of the refund of stray
// PaymentIntent piID of order orderID: stripestep.Key's
// "{order id}/stray-refund:{pi id}/1" (stripestep.StrayRefundStep).
// Derived from the two ids alone, so every process and every detection of
// the same PaymentIntent sends the same key; and a PaymentIntent can be
// refunded only up to what it charged, so even a key Stripe pruned cannot
// refund it twice.
func StrayRefundKey(orderID, piID string) string {
	return stripestep.Key(orderID, stripestep.StrayRefundStep(piID), 1)
}

// isStray reports whether pi, which names o in its metadata, moves money
// while o is not paid (nor refunded from paid), and never will be through
// pi. An order that still waits is not stray when pi is its recorded
// PaymentIntent, or when it has none yet (the saga adopts what it finds).
func isStray(o *Order, pi PaymentIntentState) bool {
	if !MovesMoney(pi.Status) {
		return false
	}
	recorded := o.Payment.PaymentIntentID
	switch {
	case recorded != "" && recorded != pi.ID:
		return true
	case o.Status.LeavesTheWayToPaid():
		return true
	}
	return false
}

// SettleStrayPayment returns nil unless pi moves money for an order that is
// not paid (see isStray), in which case it refunds it (or cancels a
// requires_capture one), counts it and logs it at error level. It is safe
// to call again for the same pi, from any process: the refund has a key
// derived from the order and the PaymentIntent, and one already at Stripe
// is not made or counted again. A PaymentIntent still processing is left
// for its succeeded event. An error means Stripe or the database did not
// answer; the caller tries again (the webhook handler answers 5xx first,
// so Stripe resends).
func (s *Service) SettleStrayPayment(ctx context.Context, pi PaymentIntentState) error {
	if !MovesMoney(pi.Status) {
		return nil
	}
	o, err := orderOfIntent(ctx, s.DB, pi)
	switch {
	case errors.Is(err, ErrOrderNotFound):
		return nil
	case err != nil:
		return err
	}
	return s.settleStray(ctx, o, pi)
}

// settleStray is SettleStrayPayment for a loaded order.
func (s *Service) settleStray(ctx context.Context, o *Order, pi PaymentIntentState) error {
	if !isStray(o, pi) {
		return nil
	}
	log := s.Logger.With("order_id", o.ID, "order_status", o.Status, "payment_intent", pi.ID,
		"status", pi.Status, "order_payment_intent", o.Payment.PaymentIntentID)
	switch pi.Status {
	case PIProcessing:
		log.ErrorContext(ctx, "a PaymentIntent is moving money for an order that is not paid; refunded once it succeeds")
		return nil
	case PIRequiresCapture:
		// Authorized, not captured: canceling releases the hold.
		got, err := s.newRun(nil, "", o).cancel(ctx, pi.ID, CancelDuplicate, "")
		if err != nil {
			s.Metrics.stray(StrayFailed)
			return fmt.Errorf("cancel stray payment %s of order %s: %w", pi.ID, o.ID, err)
		}
		if got.Status == PICanceled {
			s.Metrics.stray(StrayCanceled)
			log.ErrorContext(ctx, "money was authorized for an order that is not paid; the authorization is canceled")
			return nil
		}
		pi = got // captured meanwhile: refund it
		if pi.Status != PISucceeded {
			return fmt.Errorf("stray payment %s of order %s is %s", pi.ID, o.ID, pi.Status)
		}
	}
	if s.StrayRefunds == nil {
		s.Metrics.stray(StrayFailed)
		log.ErrorContext(ctx, "money moved for an order that is not paid, and no refund client is configured")
		return nil
	}
	// Detections of one payment run at once (a webhook and its resend, the
	// reconciler): the order's row lock makes them take turns, so the
	// second finds the first's refund and neither refunds nor counts it
	// again. The lock is held across Stripe's calls, which is acceptable
	// on this path only: it should never run.
	var got refunds.StripeRefund
	done := false
	err := postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		done = false
		if err := orders.Lock(ctx, tx, "", o.ID); err != nil {
			return err
		}
		existing, err := s.StrayRefunds.ListRefunds(ctx, pi.ID)
		if err != nil {
			return fmt.Errorf("list refunds of stray payment %s: %w", pi.ID, err)
		}
		var refunded int64
		for _, r := range existing {
			if r.Status != "failed" && r.Status != "canceled" {
				refunded += r.Amount
			}
		}
		if refunded >= pi.Amount {
			done = true // refunded already (by an earlier detection, or by hand)
			return nil
		}
		got, err = s.StrayRefunds.CreateRefund(ctx, refunds.CreateParams{
			IdempotencyKey: StrayRefundKey(o.ID, pi.ID), PaymentIntentID: pi.ID, Amount: pi.Amount - refunded,
			Reason: strayRefundReason, OrderID: o.ID, TenantID: o.TenantID,
		})
		return err
	})
	if done {
		return nil
	}
	if err != nil {
		s.Metrics.stray(StrayFailed)
		log.ErrorContext(ctx, "money moved for an order that is not paid, and its refund failed", "err", err)
		return fmt.Errorf("refund stray payment %s of order %s: %w", pi.ID, o.ID, err)
	}
	s.Metrics.stray(StrayRefunded)
	log.ErrorContext(ctx, "money moved for an order that is not paid; refunded",
		"refund", got.ID, "amount", got.Amount, "refund_status", got.Status)
	return nil
}
