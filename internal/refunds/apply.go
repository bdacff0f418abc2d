package refunds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
)

// ErrDuplicateAtStripe is returned by Apply when Stripe's refund carries
// the metadata refund_id of one of our refunds that is already bound to
// another Stripe refund: Stripe made two refunds for one of ours (which the
// saga never causes: it never sends a refund under a second key). Nothing is changed;
// operators must look (the log names both). The error wraps ErrNotOurs too.
var ErrDuplicateAtStripe = errors.New("a second Stripe refund for one of our refunds")

// ErrNotOurs is returned by Apply for a Stripe refund that is none of ours
// (neither its id nor its metadata[refund_id] names one of our refunds,
// and it is no refund made outside the service of a paid order's
// PaymentIntent: see adopt): nothing changes; a webhook handler answers
// 200 and ignores it.
var ErrNotOurs = errors.New("not one of our refunds")

// ourStatus maps Stripe's refund status
// (https://docs.stripe.com/api/refunds/object#refund_object-status) to ours:
// pending and requires_action are pending, canceled is failed.
func ourStatus(stripeStatus string) string {
	switch stripeStatus {
	case "succeeded":
		return StatusSucceeded
	case "failed", "canceled":
		return StatusFailed
	}
	return StatusPending
}

// Apply applies Stripe's state of one refund to our rows inside tx, the
// caller's transaction: the webhook handler records the event in its inbox
// in the same one, and the API and the reconciler call it from theirs.
//
// It finds our refund by Stripe's id, else by metadata[refund_id] (and then
// records Stripe's id on it), else adopts a refund made outside the service
// (the Dashboard) of a paid order's PaymentIntent as a new refund of that
// order (adopt); for a refund that is not ours it returns ErrNotOurs and
// changes nothing. It locks the order row, then the refund's, and moves the refund
// only forward: pending or requires_attention to succeeded (the order's
// amount_refunded grows, its status becomes partially_refunded or refunded,
// and order.refunded is added to the outbox, once, with the refund as its
// data), pending or requires_attention to failed (its amount becomes
// refundable again), requires_attention to pending (found at Stripe, still
// pending there), or succeeded to failed
// (Stripe failed it after all, https://docs.stripe.com/refunds#failed-refunds:
// amount_refunded and the reservation shrink; the order's status stays, no
// transition goes back). An event older than what we know changes nothing.
// changed reports whether any row changed.
//
// Commit makes the change and its event durable together; rollback leaves
// the refund as it was, and applying the same state again later is safe.
func Apply(ctx context.Context, tx *gorm.DB, st StripeRefund, now time.Time) (changed bool, err error) {
	if st.ID == "" {
		return false, fmt.Errorf("apply stripe refund: no id")
	}
	tx = tx.WithContext(ctx)
	var ids []struct {
		ID      string
		OrderID string
	}
	if err := tx.Raw(`SELECT id, order_id FROM refunds WHERE stripe_refund_id = ?`, st.ID).Scan(&ids).Error; err != nil {
		return false, fmt.Errorf("find refund of %s: %w", st.ID, err)
	}
	if len(ids) == 0 && st.Metadata["refund_id"] != "" {
		if err := tx.Raw(`SELECT id, order_id FROM refunds WHERE id = ?`, st.Metadata["refund_id"]).Scan(&ids).Error; err != nil {
			return false, fmt.Errorf("find refund %s: %w", st.Metadata["refund_id"], err)
		}
	}
	var o *orders.Balance
	if len(ids) == 0 {
		// Not made through the API: a refund made in Stripe's Dashboard
		// (or by any other client of the account) is adopted when it
		// refunds the payment of one of our paid orders.
		adopted, bal, err := adopt(ctx, tx, st, now)
		if err != nil {
			return false, err
		}
		ids = append(ids, struct {
			ID      string
			OrderID string
		}{adopted, bal.ID})
		o = bal
	} else if o, err = lockOrder(ctx, tx, "", ids[0].OrderID); err != nil {
		// Lock order: the order, then the refund, as every writer does.
		return false, err
	}
	r, err := loadRefund(ctx, tx, ids[0].ID, true)
	if err != nil {
		return false, err
	}
	if r.StripeRefundID != nil && *r.StripeRefundID != st.ID {
		// Also ErrNotOurs: a webhook for it is acknowledged, not retried
		// for days; Service.ApplyRefund logs and counts it.
		return false, fmt.Errorf("refund %s is %s at Stripe, not %s: %w: %w", r.ID, *r.StripeRefundID, st.ID, ErrDuplicateAtStripe, ErrNotOurs)
	}

	target := ourStatus(st.Status)
	set := map[string]any{}
	if r.StripeRefundID == nil {
		set["stripe_refund_id"] = st.ID
		r.StripeRefundID = &st.ID
	}
	// A parked refund (requires_attention) is as unsettled as a pending
	// one: Stripe's refund, found at last, moves it on like a pending one,
	// and to pending if Stripe still has it pending.
	open := r.Status == StatusPending || r.Status == StatusRequiresAttention
	var delta struct{ reserved, refunded int64 }
	switch {
	case open && target == StatusSucceeded:
		delta.refunded = r.Amount
	case open && target == StatusFailed:
		delta.reserved = -r.Amount
	case r.Status == StatusRequiresAttention && target == StatusPending:
	case r.Status == StatusSucceeded && target == StatusFailed:
		delta.reserved, delta.refunded = -r.Amount, -r.Amount
	default:
		target = r.Status // the same, or older than what we know
	}
	if target == r.Status && (r.StripeStatus == nil || *r.StripeStatus != st.Status) && r.Status == StatusPending {
		set["stripe_status"] = st.Status // requires_action, or pending after it
	}
	if r.Status == StatusRequiresAttention && target == StatusPending {
		// Adopted, still pending at Stripe: polled from now on like any
		// pending refund with a Stripe id; not settled, so no settled_at.
		set["status"], set["stripe_status"] = target, st.Status
		r.Status = target
	}
	if target != r.Status {
		set["status"], set["stripe_status"], set["settled_at"] = target, st.Status, now
		if target == StatusFailed {
			reason := st.FailureReason
			if reason == "" {
				reason = st.Status // canceled
			}
			set["failure_reason"] = reason
			r.FailureReason = &reason
		}
		r.Status = target
	}
	if len(set) == 0 {
		return false, nil
	}
	set["updated_at"] = now
	if err := tx.Model(&refundRow{}).Where("id = ?", r.ID).Updates(set).Error; err != nil {
		return false, fmt.Errorf("update refund %s: %w", r.ID, err)
	}
	if delta.reserved == 0 && delta.refunded == 0 {
		return true, nil
	}
	// Paid orders become partially_refunded, then refunded, as refunds
	// succeed; a failure never moves the status back (the lifecycle's
	// transitions decide).
	if err := orders.SettleRefund(ctx, tx, o.ID, delta.reserved, delta.refunded, now); err != nil {
		return false, fmt.Errorf("update order %s after refund %s: %w", o.ID, r.ID, err)
	}
	if target == StatusSucceeded {
		if err := outbox.Add(ctx, tx, outbox.Event{
			Type: outbox.TypeOrderRefunded, OccurredAt: now, TenantID: r.TenantID, AggregateID: r.OrderID, Data: r.view(),
		}); err != nil {
			return false, err
		}
	}
	return true, nil
}

// ApplyRefund is Apply inside the caller's tx with the Service's clock: the
// form the webhook handler calls, recording the event in its inbox in the
// same transaction.
func (s *Service) ApplyRefund(ctx context.Context, tx *gorm.DB, st StripeRefund) (changed bool, err error) {
	changed, err = Apply(ctx, tx, st, s.now())
	if errors.Is(err, ErrDuplicateAtStripe) {
		s.Metrics.duplicate(1)
		s.Logger.ErrorContext(ctx, "Stripe holds more than one refund for one of ours", "refund_id", st.Metadata["refund_id"],
			"stripe_refund_id", st.ID, "err", err)
	}
	return changed, err
}

// ApplyStripeRefund is Apply in its own transaction.
func (s *Service) ApplyStripeRefund(ctx context.Context, st StripeRefund) (bool, error) {
	var changed bool
	err := postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		var err error
		changed, err = s.ApplyRefund(ctx, tx, st)
		return err
	})
	return changed, err
}

// ErrRefundBeyondReserve is returned by Apply for a refund made outside
// the service (the Dashboard) whose amount does not fit in what the order
// has left to refund beside the refunds it holds: one of ours was
// reserved but is not yet at Stripe (Stripe then refuses ours for the
// amount, which gives the reservation back). Nothing is changed; applying
// the refund again later (the webhook's resend, the reconciler's next
// round) adopts it.
var ErrRefundBeyondReserve = errors.New("a refund made outside the service exceeds what the order has left to refund")

// adopt makes st, a Stripe refund none of our refunds is bound to, a refund
// of the order whose PaymentIntent it refunds, inside tx (the order's row
// locked first, as every writer of refunds does): a refund made outside
// the service, in Stripe's Dashboard or by another client of the account
// (https://docs.stripe.com/refunds#issuing). The order is the one
// st.OrderID and st.TenantID name (the metadata of the refund's
// PaymentIntent, which the caller read), and only when the refund carries
// no metadata[refund_id] (ours always do), the PaymentIntent is the
// order's recorded one, and the order was paid (paid, partially_refunded
// or refunded): a stray payment's refund is not the order's. The new
// refund starts pending, with no idempotency key, its amount reserved
// against what the order may still refund; Apply then moves it as Stripe
// says (succeeded: amount_refunded, the status, order.refunded and its
// email). It returns the refund's id and the order's balance, ErrNotOurs
// for anything else, or ErrRefundBeyondReserve.
func adopt(ctx context.Context, tx *gorm.DB, st StripeRefund, now time.Time) (string, *orders.Balance, error) {
	notOurs := fmt.Errorf("stripe refund %s: %w", st.ID, ErrNotOurs)
	if st.Metadata["refund_id"] != "" || st.OrderID == "" || st.TenantID == "" || st.PaymentIntentID == "" || st.Amount <= 0 {
		return "", nil, notOurs
	}
	o, err := lockOrder(ctx, tx, st.TenantID, st.OrderID)
	if errors.Is(err, ErrOrderNotFound) {
		return "", nil, notOurs
	}
	if err != nil {
		return "", nil, err
	}
	if o.PaymentIntentID == nil || *o.PaymentIntentID != st.PaymentIntentID || !o.Status.PaidOnce() {
		return "", nil, notOurs
	}
	// Another transaction may have adopted it while this one waited for
	// the order's lock.
	var known []string
	if err := tx.WithContext(ctx).Raw(`SELECT id FROM refunds WHERE stripe_refund_id = ?`, st.ID).Scan(&known).Error; err != nil {
		return "", nil, fmt.Errorf("find refund of %s: %w", st.ID, err)
	}
	if len(known) > 0 {
		return known[0], o, nil
	}
	if left := o.AmountTotal - o.RefundReserved; st.Amount > left {
		return "", nil, fmt.Errorf("stripe refund %s of order %s: %d > %d left: %w", st.ID, o.ID, st.Amount, left, ErrRefundBeyondReserve)
	}
	r := &refundRow{
		ID: ids.New("rf"), OrderID: o.ID, TenantID: o.TenantID, Amount: st.Amount, Currency: o.Currency,
		Status: StatusPending, PaymentIntentID: st.PaymentIntentID, StripeRefundID: &st.ID, CreatedAt: now, UpdatedAt: now,
	}
	if st.Reason != "" {
		r.Reason = &st.Reason
	}
	if err := tx.WithContext(ctx).Create(r).Error; err != nil {
		return "", nil, fmt.Errorf("adopt stripe refund %s: %w", st.ID, err)
	}
	if err := orders.Reserve(ctx, tx, o.ID, st.Amount, now); err != nil {
		return "", nil, err
	}
	o.RefundReserved += st.Amount
	return r.ID, o, nil
}
