package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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

// StrayRefundKey returns the Stripe idempotency key of attempt n of the
// refund of stray PaymentIntent piID of order orderID: stripestep.Key's
// "{order id}/stray-refund:{pi id}/{n}" (stripestep.StrayRefundStep).
// Attempt n is sent once n-1 refunds of ours of that PaymentIntent have
// failed at Stripe, so every process and every detection sends the same
// key for the same state, a failed refund is never replayed as an answer
// (issue 35, defect 5: attempt 1 forever replayed a failed refund), and
// a PaymentIntent can be refunded only up to what it charged, so no
// attempt refunds it twice.
func StrayRefundKey(orderID, piID string, n int) string {
	return stripestep.Key(orderID, stripestep.StrayRefundStep(piID), n)
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
	_, err := s.returnStray(ctx, o, pi)
	return err
}

// returnStray is settleStray, reporting whether the money is back with
// the customer: pi is not stray, its authorization was canceled, or
// refunds Stripe says succeeded cover what it charged.
func (s *Service) returnStray(ctx context.Context, o *Order, pi PaymentIntentState) (returned bool, err error) {
	if !isStray(o, pi) {
		return true, nil
	}
	log := s.Logger.With("order_id", o.ID, "order_status", o.Status, "payment_intent", pi.ID,
		"status", pi.Status, "order_payment_intent", o.Payment.PaymentIntentID)
	switch pi.Status {
	case PIProcessing:
		log.ErrorContext(ctx, "a PaymentIntent is moving money for an order that is not paid; refunded once it succeeds")
		return false, nil
	case PIRequiresCapture:
		// Authorized, not captured: canceling releases the hold.
		got, err := s.newRun(nil, "", o).cancel(ctx, pi.ID, CancelDuplicate, "")
		if err != nil {
			s.Metrics.stray(StrayFailed)
			return false, fmt.Errorf("cancel stray payment %s of order %s: %w", pi.ID, o.ID, err)
		}
		if got.Status == PICanceled {
			s.Metrics.stray(StrayCanceled)
			log.ErrorContext(ctx, "money was authorized for an order that is not paid; the authorization is canceled")
			return true, nil
		}
		pi = got // captured meanwhile: refund it
		if pi.Status != PISucceeded {
			return false, fmt.Errorf("stray payment %s of order %s is %s", pi.ID, o.ID, pi.Status)
		}
	}
	if s.StrayRefunds == nil {
		s.Metrics.stray(StrayFailed)
		log.ErrorContext(ctx, "money moved for an order that is not paid, and no refund client is configured")
		return false, nil
	}
	// Detections of one payment run at once (a webhook and its resend, the
	// reconciler): the order's row lock makes them take turns, so the
	// second finds the first's refund and neither refunds nor counts it
	// again. The lock is held across Stripe's calls, which is acceptable
	// on this path only: it should never run.
	var out strayRefund
	err = postgres.WithTx(ctx, s.DB, func(tx *gorm.DB) error {
		if err := orders.Lock(ctx, tx, "", o.ID); err != nil {
			return err
		}
		var err error
		out, err = s.refundStray(ctx, tx, o, pi)
		return err
	})
	if err == nil {
		err = out.callErr
	}
	switch {
	case err != nil:
		s.Metrics.stray(StrayFailed)
		log.ErrorContext(ctx, "money moved for an order that is not paid, and its refund failed; sent again until Stripe says it succeeded", "err", err)
		return false, fmt.Errorf("refund stray payment %s of order %s: %w", pi.ID, o.ID, err)
	case out.sent != nil:
		if out.attempt == 1 {
			// A stray payment counts once; a refund sent again after
			// Stripe failed the last is the same payment's.
			s.Metrics.stray(StrayRefunded)
		}
		log.ErrorContext(ctx, "money moved for an order that is not paid; refunded",
			"refund", out.sent.ID, "amount", out.sent.Amount, "refund_status", out.sent.Status, "attempt", out.attempt)
	}
	return out.returned, nil
}

// strayRefund is what refundStray did: the refund it sent (nil when
// refunds Stripe holds cover the payment already), the attempt, whether
// refunds Stripe says succeeded cover the payment (returned), and the
// error of Stripe's call, if any.
type strayRefund struct {
	sent     *refunds.StripeRefund
	attempt  int
	returned bool
	callErr  error
}

// maxStrayAttempts bounds the refunds of one stray payment one run sends:
// each is sent only after the one before failed at Stripe.
const maxStrayAttempts = 3

// refundStray refunds stray PaymentIntent pi of order o inside tx, which
// holds the order's row, until refunds Stripe has not failed cover what
// it charged: it lists pi's refunds at Stripe (strongly consistent) and,
// while they do not, sends attempt n of the stray refund step, n being one
// more than the refunds of ours Stripe failed (an attempt written but not
// answered is sent again as it was written). Each attempt is written in
// the step log before its call and its answer after, so the reconciler
// (ReturnStrayPayments) finds it again; the latest attempt's status
// follows Stripe's refund. Stripe's errors are returned in callErr (the
// attempts written commit); the error is the database's.
func (s *Service) refundStray(ctx context.Context, tx *gorm.DB, o *Order, pi PaymentIntentState) (strayRefund, error) {
	var out strayRefund
	step := stripestep.StrayRefundStep(pi.ID)
	for range maxStrayAttempts {
		existing, err := s.StrayRefunds.ListRefunds(ctx, pi.ID)
		if err != nil {
			out.callErr = fmt.Errorf("list refunds of stray payment %s: %w", pi.ID, err)
			return out, nil
		}
		var covered, succeeded int64
		failed := 0
		status := map[string]string{}
		for _, r := range existing {
			status[r.ID] = r.Status
			switch r.Status {
			case "failed", "canceled":
				if r.Metadata["order_id"] == o.ID && r.Metadata["refund_id"] == "" {
					failed++
				}
			case "succeeded":
				succeeded += r.Amount
				covered += r.Amount
			default:
				covered += r.Amount // on its way
			}
		}
		out.returned = succeeded >= pi.Amount
		latest, err := stripestep.Latest(ctx, tx, o.ID, step)
		if err != nil {
			return out, err
		}
		now := s.Now().UTC().Truncate(time.Microsecond)
		if latest != nil && latest.StripeObjectID != nil {
			if st, ok := status[*latest.StripeObjectID]; ok && (latest.StripeStatus == nil || *latest.StripeStatus != st) {
				// Stripe moved the refund on (succeeded, or failed).
				if err := stripestep.Finish(ctx, tx, latest, stripestep.Answer{Outcome: stripestep.Succeeded,
					ObjectID: *latest.StripeObjectID, Status: st}, now); err != nil {
					return out, err
				}
			}
		}
		if covered >= pi.Amount {
			return out, nil // refunded already (by an earlier detection, or by hand), or on its way
		}
		n, amount := failed+1, pi.Amount-covered
		var a *stripestep.Attempt
		if latest != nil && latest.Attempt >= n && latest.StripeObjectID == nil {
			// Written, never answered with a refund: its key is sent
			// again as it was, with what it was written with.
			a, n = latest, latest.Attempt
			var req struct{ Amount int64 }
			if err := json.Unmarshal(latest.RequestParams, &req); err == nil && req.Amount > 0 {
				amount = req.Amount
			}
		} else {
			n = max(n, attemptOf(latest)+1)
			params, err := json.Marshal(map[string]any{"payment_intent": pi.ID, "amount": amount, "reason": strayRefundReason,
				"metadata": map[string]string{"order_id": o.ID, "tenant_id": o.TenantID}})
			if err != nil {
				return out, err
			}
			a = stripestep.NewAttempt(o.ID, o.TenantID, step, n, pi.ID, params, now)
			if err := stripestep.Insert(ctx, tx, a); err != nil && !errors.Is(err, stripestep.ErrTaken) {
				return out, err
			}
		}
		out.attempt = n
		got, err := s.StrayRefunds.CreateRefund(ctx, refunds.CreateParams{
			IdempotencyKey: StrayRefundKey(o.ID, pi.ID, n), PaymentIntentID: pi.ID, Amount: amount,
			Reason: strayRefundReason, OrderID: o.ID, TenantID: o.TenantID,
		})
		if err != nil {
			out.callErr = err
			answer := stripestep.Answer{Outcome: stripestep.OutcomeOf(err), Error: err.Error()}
			return out, stripestep.Finish(ctx, tx, a, answer, now)
		}
		if err := stripestep.Finish(ctx, tx, a, stripestep.Answer{Outcome: stripestep.Succeeded, ObjectID: got.ID, Status: got.Status}, now); err != nil {
			return out, err
		}
		if got.Status == "failed" || got.Status == "canceled" {
			continue // a replay of a refund Stripe failed since: the next attempt
		}
		out.sent = &got
		out.returned = got.Status == "succeeded" && succeeded+got.Amount >= pi.Amount
		return out, nil
	}
	out.callErr = fmt.Errorf("stray payment %s: %d refunds failed at Stripe in one run", pi.ID, maxStrayAttempts)
	return out, nil
}

func attemptOf(a *stripestep.Attempt) int {
	if a == nil {
		return 0
	}
	return a.Attempt
}

// strayStatus is what ReturnStrayPayments found of the stray payments
// (CONTRACT.md: PaymentIntents that moved money for an order that is not
// paid).
type strayStatus struct {
	// Unreturned counts the stray payments whose refund Stripe has not
	// said succeeded (failed, pending, or unanswered), after the round;
	// Amounts sums, by currency, what their latest refunds were sent for
	// (minor units): the money not returned yet.
	Unreturned int
	Amounts    map[string]int64
}

// ReturnStrayPayments looks again at every stray payment whose latest
// refund Stripe has not said succeeded (stripestep.StrayRefunds): it reads
// the PaymentIntent from Stripe and settles it as a detection would
// (SettleStrayPayment: the refund sent again under the next attempt's key
// once Stripe failed the last), then counts the ones whose money is still
// not back (refunds Stripe says succeeded do not cover what it charged) in
// checkout_payments_stray_unreturned and
// checkout_payments_stray_unreturned_amount, which an alert watches. The
// reconciler calls it each round. An error for one payment is joined, the
// payment counted as not returned, and the others go on. It returns how
// many stray payments are not returned.
//
// A stray payment returned by a refund that is not its latest attempt's
// (refunded by hand in the Dashboard after ours failed) is read from
// Stripe again each round: the log records only Stripe's answers to its
// own attempts.
func (s *Service) ReturnStrayPayments(ctx context.Context) (int, error) {
	var errs []error
	latest, err := stripestep.StrayRefunds(ctx, s.DB)
	if err != nil {
		return 0, err
	}
	st := strayStatus{Amounts: map[string]int64{}}
	for _, a := range latest {
		if a.StripeStatus != nil && *a.StripeStatus == "succeeded" {
			continue
		}
		returned, cur, err := s.returnStrayOf(ctx, &a)
		if err != nil {
			errs = append(errs, err)
		}
		if returned {
			continue
		}
		var req struct{ Amount int64 }
		_ = json.Unmarshal(a.RequestParams, &req) // written by refundStray
		st.Unreturned++
		st.Amounts[cur] += req.Amount
	}
	s.Metrics.unreturned(st)
	return st.Unreturned, errors.Join(errs...)
}

// returnStrayOf is returnStray for the stray payment of attempt a, with
// its order's currency ("usd" when the order cannot be read).
func (s *Service) returnStrayOf(ctx context.Context, a *stripestep.Attempt) (returned bool, currency string, err error) {
	currency = "usd"
	o, err := loadOrder(ctx, s.DB, a.TenantID, a.OrderID)
	if err != nil {
		return false, currency, err
	}
	currency = o.Currency
	pi, err := s.Payments.RetrievePaymentIntent(ctx, a.Target())
	if err != nil {
		return false, currency, fmt.Errorf("retrieve stray payment %s: %w", a.Target(), err)
	}
	returned, err = s.returnStray(ctx, o, pi)
	return returned, currency, err
}
