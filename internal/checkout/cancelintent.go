package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/stripestep"
)

// cancelOrphans cancels, best effort, every PaymentIntent of found other
// than keep that does not move money: orphans of indeterminate creates.
// They were never confirmed, so they are harmless until then; a failure is
// logged and the next reconciliation finds them again.
func (r *run) cancelOrphans(ctx context.Context, found []PaymentIntentState, keep string) {
	for _, pi := range found {
		if pi.ID == keep || pi.Status == stripeintent.Canceled || pi.Status.MovesMoney() {
			if pi.ID != keep && pi.Status.MovesMoney() {
				// A second one moving money: stray, refunded.
				o := *r.o
				o.Payment.PaymentIntentID = keep
				if err := r.s.settleStray(ctx, &o, pi); err != nil {
					r.s.Logger.WarnContext(ctx, "refund a stray payment", "order_id", r.o.ID, "payment_intent", pi.ID, "err", err)
				}
			}
			continue
		}
		if _, err := r.cancel(ctx, pi.ID, CancelDuplicate, ""); err != nil {
			r.s.Logger.WarnContext(ctx, "cancel orphan PaymentIntent", "order_id", r.o.ID, "payment_intent", pi.ID, "err", err)
		}
	}
}

// cancel cancels PaymentIntent piID of the order with reason (Stripe's
// cancellation_reason) and returns Stripe's state of it afterwards:
// canceled, or whatever state made the cancellation impossible (succeeded,
// say). cause is why (CancelIntentRequest.Cause), written with the attempt
// before it is sent; "" for an orphan. Indeterminate answers are
// reconciled with a GET before a new attempt.
func (r *run) cancel(ctx context.Context, piID, reason, cause string) (PaymentIntentState, error) {
	newAttempts := 0
	raced := false
	for {
		all, err := stripestep.Load(ctx, r.s.DB, r.o.ID, stripestep.StepCancel)
		if err != nil {
			return PaymentIntentState{}, err
		}
		var last *stripestep.Attempt
		maxN := 0
		for i := range all {
			maxN = max(maxN, all[i].Attempt)
			if all[i].Target() == piID {
				last = &all[i]
			}
		}
		var a *stripestep.Attempt
		switch {
		case last != nil && last.Resendable(r.s.Now()):
			a = last
		case last != nil:
			cur, err := r.s.Payments.RetrievePaymentIntent(ctx, piID)
			if err != nil {
				return PaymentIntentState{}, err
			}
			if !cur.Status.Cancelable() {
				return cur, nil
			}
		}
		if a == nil {
			if newAttempts == r.cfg.MaxAttempts {
				return PaymentIntentState{}, &waitError{reason: fmt.Sprintf("cancel of %s: %d new attempts in one run", piID, newAttempts)}
			}
			newAttempts++
			a = r.newAttempt(stripestep.StepCancel, maxN+1, piID, CancelIntentRequest{PaymentIntentID: piID, Reason: reason, Cause: cause})
			if err := r.begin(ctx, a); err != nil {
				if errors.Is(err, stripestep.ErrTaken) && !raced {
					// Another run (a webhook closing the same payment)
					// wrote this attempt first: read it and join it under
					// its key, which Stripe answers once. Once only: a
					// second refusal means our lease is gone.
					raced = true
					newAttempts--
					continue
				}
				return PaymentIntentState{}, err
			}
		}
		var req CancelIntentRequest
		if err := json.Unmarshal(a.RequestParams, &req); err != nil {
			return PaymentIntentState{}, fmt.Errorf("decode cancel attempt %s: %w", a.IdempotencyKey, err)
		}
		req.IdempotencyKey = a.IdempotencyKey
		got, err := r.s.Payments.CancelPaymentIntent(ctx, req)
		res := r.recordAnswer(ctx, a, got, err)
		switch {
		case res.err != nil:
			return PaymentIntentState{}, res.err
		case res.refusal != nil:
			cur, gerr := r.s.Payments.RetrievePaymentIntent(ctx, piID)
			if gerr != nil {
				return PaymentIntentState{}, gerr
			}
			return cur, nil
		case res.indeterminate:
			continue
		}
		return got, nil
	}
}
