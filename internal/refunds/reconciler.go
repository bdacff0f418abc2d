package refunds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/onceonly/checkout/internal/stripestep"
)

// PollPending asks Stripe for the state of up to limit refunds that are
// pending at Stripe (they have a Stripe id) and whose row has not changed
// for olderThan, oldest first, and applies it: the polling half of "statuses
// follow Stripe" (webhooks are the other). It returns how many refunds
// changed. A refund whose retrieval fails stays pending and is tried in a
// later round. Refunds with no Stripe id yet belong to their idempotency
// key, which the completer finishes. A refund Stripe fails after it had
// succeeded is not polled: its refund.failed or refund.updated webhook
// applies that (internal/webhooks).
func (s *Service) PollPending(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	var due []refundRow
	err := s.DB.WithContext(ctx).
		Where("status = ? AND stripe_refund_id IS NOT NULL AND updated_at <= ?", StatusPending, s.now().Add(-olderThan)).
		Order("updated_at").Limit(limit).Find(&due).Error
	if err != nil {
		return 0, fmt.Errorf("refunds: list pending: %w", err)
	}
	changed := 0
	var errs []error
	for _, r := range due {
		st, err := s.Stripe.GetRefund(ctx, *r.StripeRefundID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ok, err := s.ApplyStripeRefund(ctx, st)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ok {
			changed++
			continue
		}
		// Still pending: look again after olderThan, not every round.
		if err := s.DB.WithContext(ctx).Model(&refundRow{}).Where("id = ? AND status = ?", r.ID, StatusPending).
			Update("updated_at", s.now()).Error; err != nil {
			errs = append(errs, err)
		}
	}
	return changed, errors.Join(errs...)
}

// ReconcileParked looks at Stripe, for up to limit refunds parked in
// requires_attention whose row has not changed for olderThan (oldest
// first), for the refund of each: it lists the PaymentIntent's refunds and
// matches metadata[refund_id], as the request did. One that shows up (a
// stored 500 that Stripe rolled forward late) is adopted and applied
// (pending, succeeded or failed, as Stripe says); the others stay parked
// and are looked at again after olderThan. It never creates a refund at
// Stripe. It returns how many were adopted, and sets
// checkout_refunds_requiring_attention to the refunds still parked.
func (s *Service) ReconcileParked(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	var due []refundRow
	err := s.DB.WithContext(ctx).
		Where("status = ? AND updated_at <= ?", StatusRequiresAttention, s.now().Add(-olderThan)).
		Order("updated_at").Limit(limit).Find(&due).Error
	if err != nil {
		return 0, fmt.Errorf("refunds: list parked: %w", err)
	}
	adopted := 0
	var errs []error
	for i := range due {
		r := &due[i]
		found, err := s.reconcile(ctx, r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if found == nil {
			if err := s.DB.WithContext(ctx).Model(&refundRow{}).Where("id = ? AND status = ?", r.ID, StatusRequiresAttention).
				Update("updated_at", s.now()).Error; err != nil {
				errs = append(errs, err)
			}
			continue
		}
		s.Metrics.reconciled(ReconcileFound)
		s.Logger.WarnContext(ctx, "parked refund found at Stripe: adopted", "refund_id", r.ID, "stripe_refund_id", found.ID, "status", found.Status)
		if a, err := latestAttempt(ctx, s.DB, r); err == nil && a != nil {
			if err := recordAttempt(ctx, s.DB, a, stripestep.Succeeded, found, nil, s.now()); err != nil {
				s.Logger.WarnContext(ctx, "record refund attempt", "err", err)
			}
		}
		if _, err := s.ApplyStripeRefund(ctx, *found); err != nil {
			errs = append(errs, err)
			continue
		}
		adopted++
	}
	var parked int64
	if err := s.DB.WithContext(ctx).Model(&refundRow{}).Where("status = ?", StatusRequiresAttention).Count(&parked).Error; err != nil {
		errs = append(errs, fmt.Errorf("refunds: count parked: %w", err))
	} else {
		s.Metrics.requiringAttention(parked)
	}
	return adopted, errors.Join(errs...)
}

// DefaultOutsideLookback is how far back the refund reconciler's first
// round looks for refunds made outside the service (Service.OutsideLookback):
// 72 hours, the time Stripe keeps resending a webhook that was not
// acknowledged (https://docs.stripe.com/webhooks#retries), beyond which
// no webhook would have brought it either.
const DefaultOutsideLookback = 72 * time.Hour

// AdoptOutside is the polling half of "a refund made in the Dashboard
// reaches its order" (webhooks are the other, internal/webhooks): it lists
// the account's refunds created since its last round (the first round:
// OutsideLookback before now) and applies each one that none of our
// refunds is bound to and that carries no metadata[refund_id], with the
// order its PaymentIntent names: Apply adopts it when that PaymentIntent
// paid the order. Refunds already known are skipped without a call. It
// returns how many refunds changed; with no OutsideStripe (s.Stripe does
// not implement it) it does nothing. The next round starts from the
// newest refund seen, and a round that failed for any refund starts again
// from the same point.
func (s *Service) AdoptOutside(ctx context.Context) (int, error) {
	os, ok := s.Stripe.(OutsideStripe)
	if !ok {
		return 0, nil
	}
	s.outsideMu.Lock()
	defer s.outsideMu.Unlock()
	since := s.outsideSince
	if since.IsZero() {
		lookback := s.OutsideLookback
		if lookback <= 0 {
			lookback = DefaultOutsideLookback
		}
		since = s.now().Add(-lookback)
	}
	list, err := os.ListRefundsSince(ctx, since)
	if err != nil {
		return 0, fmt.Errorf("refunds: list refunds since %s: %w", since.Format(time.RFC3339), err)
	}
	next, changed := since, 0
	var errs []error
	for _, st := range list {
		if c := time.Unix(st.Created, 0); c.After(next) {
			next = c
		}
		if st.Metadata["refund_id"] != "" || st.PaymentIntentID == "" {
			continue // ours, made through the API: the saga, webhooks and PollPending settle it
		}
		var known int64
		if err := s.DB.WithContext(ctx).Model(&refundRow{}).Where("stripe_refund_id = ?", st.ID).Count(&known).Error; err != nil {
			errs = append(errs, err)
			continue
		}
		if known > 0 {
			continue // adopted already: PollPending and webhooks move it on
		}
		if st.OrderID, st.TenantID, err = os.IntentOrder(ctx, st.PaymentIntentID); err != nil {
			errs = append(errs, err)
			continue
		}
		ok, err := s.ApplyStripeRefund(ctx, st)
		switch {
		case errors.Is(err, ErrNotOurs):
		case err != nil:
			errs = append(errs, err)
		case ok:
			changed++
			s.Logger.InfoContext(ctx, "refund made outside the service adopted", "stripe_refund_id", st.ID,
				"order_id", st.OrderID, "amount", st.Amount, "status", st.Status)
		}
	}
	if len(errs) == 0 {
		s.outsideSince = next
	}
	return changed, errors.Join(errs...)
}

// RunReconciler polls pending refunds, reconciles parked ones, and adopts
// refunds made outside the service (AdoptOutside), every interval until ctx
// ends, then returns nil. Errors are logged and retried in the next round.
func (s *Service) RunReconciler(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if n, err := s.PollPending(ctx, interval, 100); err != nil && ctx.Err() == nil {
			s.Logger.Warn("refunds: poll pending refunds", "err", err)
		} else if n > 0 {
			s.Logger.Info("refunds: pending refunds settled by Stripe", "count", n)
		}
		if n, err := s.ReconcileParked(ctx, interval, 100); err != nil && ctx.Err() == nil {
			s.Logger.Warn("refunds: reconcile parked refunds", "err", err)
		} else if n > 0 {
			s.Logger.Info("refunds: parked refunds found at Stripe", "count", n)
		}
		if n, err := s.AdoptOutside(ctx); err != nil && ctx.Err() == nil {
			s.Logger.Warn("refunds: adopt refunds made outside the service", "err", err)
		} else if n > 0 {
			s.Logger.Info("refunds: refunds made outside the service adopted", "count", n)
		}
	}
}
