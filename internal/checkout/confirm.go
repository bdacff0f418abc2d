package checkout

import (
	"context"
	"errors"
	"fmt"

	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/stripestep"
)

// confirm confirms the order's PaymentIntent pi and returns the verdict to
// apply. After an indeterminate confirm (or one whose key may have been
// pruned) it reads the PaymentIntent by id and confirms again, under the
// next attempt's key, only if Stripe says it is still unconfirmed.
func (r *run) confirm(ctx context.Context, pi PaymentIntentState) (*verdict, error) {
	newAttempts := r.confirmed
	for {
		all, err := stripestep.Load(ctx, r.s.DB, r.o.ID, stripestep.StepConfirm)
		if err != nil {
			return nil, err
		}
		var last *stripestep.Attempt
		maxN := 0
		for i := range all {
			maxN = max(maxN, all[i].Attempt)
			if all[i].Target() == pi.ID {
				last = &all[i]
			}
		}
		switch {
		case last == nil && (pi.Status == stripeintent.RequiresConfirmation || pi.Status == ""):
		case last == nil:
			// Adopted in another state: Stripe's state is the truth.
			cur, err := r.s.Payments.RetrievePaymentIntent(ctx, pi.ID)
			if err != nil {
				return nil, err
			}
			if cur.Status != stripeintent.RequiresConfirmation {
				return r.verdictOf(cur)
			}
		case last.Resendable(r.s.Now()):
			v, err := r.confirmAttempt(ctx, pi.ID, last)
			if v != nil || err != nil {
				return v, err
			}
			continue
		default:
			// Answered before this run (resume), indeterminate, or a key
			// Stripe may have pruned: ask Stripe for the PaymentIntent,
			// strongly consistent, and act on what it says.
			cur, err := r.s.Payments.RetrievePaymentIntent(ctx, pi.ID)
			if err != nil {
				return nil, err
			}
			if cur.Status != stripeintent.RequiresConfirmation {
				return r.verdictOf(cur)
			}
			if last.Outcome == stripestep.Rejected {
				// Refused, and still unconfirmed: final, never sent again.
				return &verdict{refusal: refusalOf(last)}, nil
			}
		}
		if newAttempts == r.cfg.MaxAttempts {
			return nil, &waitError{reason: fmt.Sprintf("confirm of order %s: %d new attempts in one run", r.o.ID, newAttempts)}
		}
		newAttempts++
		a := r.newAttempt(stripestep.StepConfirm, maxN+1, pi.ID, ConfirmIntentRequest{PaymentIntentID: pi.ID, ReturnURL: r.o.ReturnURL})
		if err := r.begin(ctx, a); err != nil {
			return nil, err
		}
		v, err := r.confirmAttempt(ctx, pi.ID, a)
		if v != nil || err != nil {
			return v, err
		}
	}
}

// confirmAttempt sends confirm attempt a (already written) and returns the
// verdict, an error, or nil, nil after an indeterminate answer.
func (r *run) confirmAttempt(ctx context.Context, piID string, a *stripestep.Attempt) (*verdict, error) {
	got, err := r.s.Payments.ConfirmPaymentIntent(ctx, ConfirmIntentRequest{
		IdempotencyKey: a.IdempotencyKey, PaymentIntentID: piID, ReturnURL: r.o.ReturnURL})
	return r.confirmVerdict(ctx, piID, a, got, err)
}

// confirmVerdict records the answer (got, err) to confirm attempt a of
// PaymentIntent piID and returns what confirmAttempt does.
func (r *run) confirmVerdict(ctx context.Context, piID string, a *stripestep.Attempt, got PaymentIntentState, err error) (*verdict, error) {
	res := r.recordAnswer(ctx, a, got, err)
	switch {
	case res.err != nil:
		return nil, res.err
	case res.indeterminate:
		return nil, nil
	case res.refusal != nil && res.refusal.Declined:
		return &verdict{refusal: res.refusal, pi: res.refusal.PaymentIntent}, nil
	case res.refusal != nil:
		// Refused, but perhaps because the PaymentIntent moved on (a
		// rolled-forward confirm made it succeed): Stripe's state decides.
		cur, gerr := r.s.Payments.RetrievePaymentIntent(ctx, piID)
		if gerr != nil {
			var missing *PaymentRefusal
			if errors.As(gerr, &missing) {
				return &verdict{refusal: res.refusal}, nil
			}
			return nil, gerr
		}
		if cur.Status == stripeintent.RequiresConfirmation {
			return &verdict{refusal: res.refusal}, nil
		}
		return r.verdictOf(cur)
	}
	return r.verdictOf(got)
}
