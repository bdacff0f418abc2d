package checkout

import (
	"context"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/stripeintent"
)

// ApplyPaymentIntentTx is ApplyPaymentIntent inside the caller's
// transaction tx, for the Stripe webhook handler, which records the event
// in its inbox in the same transaction (internal/webhooks): commit makes the
// order's orders.Change, its stock release and its event durable together with the
// record; rollback forgets all of them. It reads and writes only through tx.
//
// It returns ErrOrderNotFound when pi's metadata names no order of the
// tenant, and changed=false when pi is not the order's recorded
// PaymentIntent or the order is already where pi would take it or further
// (the same monotonic transitions as every other path).
func (s *Service) ApplyPaymentIntentTx(ctx context.Context, tx *gorm.DB, pi PaymentIntentState) (changed bool, err error) {
	o, err := orderOfIntent(ctx, tx, pi)
	if err != nil {
		return false, err
	}
	if o.Payment.PaymentIntentID != pi.ID {
		if pi.Status.MovesMoney() {
			s.Logger.ErrorContext(ctx, "a PaymentIntent that is not the order's moves money",
				"order_id", o.ID, "payment_intent", pi.ID, "status", pi.Status, "order_payment_intent", o.Payment.PaymentIntentID)
		}
		return false, nil
	}
	cause := ""
	if pi.Status == stripeintent.Canceled {
		if cause, err = cancelCause(ctx, tx, o.ID, pi.ID); err != nil {
			return false, err
		}
	}
	r := s.newRun(nil, "", o)
	ch, ok := r.changeFor(pi, cause)
	if !ok {
		return false, nil
	}
	return s.applyTx(ctx, tx, o, ch, r.now())
}
