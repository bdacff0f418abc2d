package refunds

import (
	"context"
	"errors"
	"fmt"
	"time"
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

// RunReconciler polls pending refunds every interval until ctx ends, then
// returns nil. Errors are logged and retried in the next round.
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
	}
}
