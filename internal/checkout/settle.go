package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripestep"
)

// verdictOf returns the verdict for a PaymentIntent's state, or a wait when
// the state settles nothing yet (processing, requires_capture).
func (r *run) verdictOf(pi PaymentIntentState) (*verdict, error) {
	if _, ok := r.changeFor(pi, ""); !ok {
		return nil, &waitError{reason: fmt.Sprintf("payment intent %s of order %s is %s", pi.ID, r.o.ID, pi.Status)}
	}
	return &verdict{pi: &pi}, nil
}

// changeFor returns the order change Stripe's state of the order's
// PaymentIntent calls for, and false when it calls for none. cause is why
// this service canceled pi (cancelCause), "" when it did not or pi is not
// canceled.
//
// A PaymentIntent canceled by someone else (the Dashboard, or Stripe
// itself: any cancellation_reason,
// https://docs.stripe.com/api/payment_intents/object#payment_intent_object-cancellation_reason)
// ends the order too: the customer's own reason (requested_by_customer)
// makes it canceled where the lifecycle allows (from requires_action),
// and anything else, or the same reason while the order is still
// pending_payment or payment_unknown, makes it payment_failed
// (FailurePaymentCanceled). Either way its key gets a final answer.
func (r *run) changeFor(pi PaymentIntentState, cause string) (orders.Change, bool) {
	ch := orders.Change{PaymentIntentID: pi.ID, PaymentStatus: pi.Status}
	switch pi.Status {
	case PISucceeded:
		ch.To = orders.Paid
	case PIRequiresAction:
		ch.To, ch.NextAction, ch.ClientSecret = orders.RequiresAction, pi.NextAction, pi.ClientSecret
	case PIRequiresPaymentMethod:
		if !failedAttempt(pi) {
			return ch, false // never confirmed
		}
		// Open for another attempt: closeBeforeExit cancels it first.
		ch.To, ch.FailureCode, ch.DeclineCode = orders.PaymentFailed, CodeCardDeclined, firstOf(pi.LastDeclineCode, pi.LastErrorCode)
	case PICanceled:
		switch {
		case cause == FailureCanceled:
			// The customer's POST /v1/orders/{id}/cancel, only ever sent
			// for an order in requires_action.
			ch.To, ch.FailureCode = r.canceledOrFailed(), FailureCanceled
		case pi.CancellationReason == CancelAbandoned && failedAttempt(pi):
			// Closed after a failed attempt (by closeBeforeExit, or by
			// hand): the decline is why.
			ch.To, ch.FailureCode, ch.DeclineCode = orders.PaymentFailed, CodeCardDeclined, firstOf(pi.LastDeclineCode, pi.LastErrorCode)
		case cause != "":
			// Closed by closeBeforeExit, for the reason it wrote with its
			// cancel: a rejection, a timeout.
			ch.To, ch.FailureCode = orders.PaymentFailed, cause
		case pi.CancellationReason == CancelRequestedByCustomer:
			// Canceled outside the service for the customer.
			ch.To, ch.FailureCode = r.canceledOrFailed(), FailurePaymentCanceled
		default:
			// Canceled outside the service (the Dashboard, Stripe) for
			// any other reason, or none.
			ch.To, ch.FailureCode = orders.PaymentFailed, FailurePaymentCanceled
		}
	default:
		return ch, false
	}
	return ch, true
}

// canceledOrFailed returns canceled when the run's order may become
// canceled (it waits in requires_action), else payment_failed: the
// lifecycle lets only an order waiting for its customer be canceled, and an
// order whose PaymentIntent is canceled must still leave the way to paid.
// The order only moves forward meanwhile, and payment_failed is reachable
// from every status canceled is, so the choice stays applicable.
func (r *run) canceledOrFailed() orders.Status {
	if r.o != nil && r.o.Status.CanMoveTo(orders.Canceled) {
		return orders.Canceled
	}
	return orders.PaymentFailed
}

// failedAttempt reports whether pi's latest confirmation failed: Stripe
// then sets last_payment_error (a decline, a failed 3D Secure challenge).
func failedAttempt(pi PaymentIntentState) bool {
	return pi.LastErrorCode != "" || pi.LastDeclineCode != ""
}

// closeBeforeExit is the order lifecycle's rule for leaving the way to
// paid, in the one place every exit goes through before its transaction
// (the API's and the completer's saga, the reconciler, the webhook
// handler, PAYMENT_ACTION_TIMEOUT): an order becomes payment_failed or
// canceled only once its PaymentIntent can no longer move money.
//
// Stripe keeps a PaymentIntent whose attempt failed open for another
// attempt: a decline returns it to requires_payment_method
// (https://docs.stripe.com/payments/paymentintents/lifecycle), a confirm
// Stripe answered with a stored 500 may still be rolled forward
// (https://docs.stripe.com/error-low-level#server-errors), and the customer
// of a 3D Secure checkout holds its client_secret. Any of them could
// charge an order that failed and released its stock. So ch, a change to
// payment_failed or canceled, comes back marked closed once the order's
// PaymentIntent is canceled at Stripe (cancellation_reason abandoned; ch
// keeps its failure codes), or was already, or the order has none (a
// create refused; orphans of indeterminate creates are the sweep's). When
// Stripe refuses the cancel because the PaymentIntent succeeded
// meanwhile, the change returned is the one that state calls for: paid.
// Any other change is returned as it is. An error (Stripe unanswered, or a
// PaymentIntent still processing) means the order must wait.
func (r *run) closeBeforeExit(ctx context.Context, ch orders.Change) (orders.Change, error) {
	if !ch.To.LeavesTheWayToPaid() || ch.Closed {
		return ch, nil
	}
	id := r.o.Payment.PaymentIntentID
	switch {
	case ch.PaymentStatus == PICanceled, id == "" && ch.PaymentIntentID == "":
		ch.Closed = true
		return ch, nil
	case !r.o.Status.CanMoveTo(ch.To):
		return ch, nil // already settled: nothing to leave (statuses only move forward)
	case id == "":
		id = ch.PaymentIntentID
	}
	r.s.Logger.InfoContext(ctx, "closing the order's PaymentIntent before the order leaves the way to paid",
		"order_id", r.o.ID, "payment_intent", id, "to", ch.To, "code", firstOf(ch.DeclineCode, ch.FailureCode))
	got, err := r.cancel(ctx, id, CancelAbandoned, ch.FailureCode)
	if err != nil {
		return ch, fmt.Errorf("close the payment of order %s before it is %s: %w", r.o.ID, ch.To, err)
	}
	if got.Status == PICanceled {
		ch.PaymentIntentID, ch.PaymentStatus, ch.Closed = id, PICanceled, true
		return ch, nil
	}
	// Stripe refused the cancel: the PaymentIntent moved on.
	moved, ok := r.changeFor(got, "")
	if !ok || moved.To.LeavesTheWayToPaid() {
		return ch, &waitError{reason: fmt.Sprintf("payment intent %s of order %s is %s and cannot be canceled", id, r.o.ID, got.Status)}
	}
	r.s.Logger.WarnContext(ctx, "the order's PaymentIntent moved on before it could be closed; applying Stripe's state",
		"order_id", r.o.ID, "payment_intent", id, "status", got.Status, "instead_of", ch.To)
	return moved, nil
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// changeOf returns the change a verdict calls for.
func (r *run) changeOf(ctx context.Context, v *verdict) (orders.Change, bool, error) {
	if f := v.refusal; f != nil {
		ch := orders.Change{To: orders.PaymentFailed, FailureCode: CodePaymentRejected}
		if v.pi != nil {
			ch.PaymentIntentID, ch.PaymentStatus = v.pi.ID, v.pi.Status
		}
		if f.Declined {
			ch.FailureCode, ch.DeclineCode = CodeCardDeclined, firstOf(f.DeclineCode, f.Code)
		}
		return ch, true, nil
	}
	cause := ""
	if v.pi.Status == PICanceled {
		var err error
		if cause, err = cancelCause(ctx, r.s.DB, r.o.ID, v.pi.ID); err != nil {
			return orders.Change{}, false, err
		}
	}
	ch, ok := r.changeFor(*v.pi, cause)
	return ch, ok, nil
}

// cancelCause returns why this service canceled the order's PaymentIntent
// piID, from the cancel attempts written in the step log before each
// cancel was sent: FailureCanceled when the customer asked for it (POST
// /v1/orders/{id}/cancel), else the Cause of the first attempt that has
// one, FailureActionTimeout for a cancel of ours with reason abandoned
// written before cancels carried a cause (only the timeout sent those),
// and "" when no cancel of ours gives one (someone else canceled it: the
// Dashboard, Stripe; or it was an orphan).
func cancelCause(ctx context.Context, db *gorm.DB, orderID, piID string) (string, error) {
	all, err := stripestep.Load(ctx, db, orderID, StepCancel)
	if err != nil {
		return "", err
	}
	cause, legacy := "", false
	for _, a := range all {
		if a.Target() != piID {
			continue
		}
		var req CancelIntentRequest
		if err := json.Unmarshal(a.RequestParams, &req); err != nil {
			return "", fmt.Errorf("decode cancel attempt %s: %w", a.IdempotencyKey, err)
		}
		if req.Reason == CancelRequestedByCustomer {
			return FailureCanceled, nil
		}
		if cause == "" {
			cause = req.Cause
		}
		legacy = legacy || (req.Cause == "" && req.Reason == CancelAbandoned)
	}
	if cause == "" && legacy {
		return FailureActionTimeout, nil
	}
	return cause, nil
}

// settle applies v (if any) to the order in one transaction, monotonically:
// the status orders.Change, the stock given back, the event, and, when the run
// holds a key, the key finished with the response the order's state calls
// for. It returns that response (nil without a key).
func (r *run) settle(ctx context.Context, v *verdict) (*idempotency.Response, error) {
	var ch orders.Change
	apply := false
	if v != nil {
		var err error
		if ch, apply, err = r.changeOf(ctx, v); err != nil {
			return r.stop(ctx, err)
		}
		if apply {
			if ch, err = r.closeBeforeExit(ctx, ch); err != nil {
				return r.stop(ctx, err)
			}
		}
	}
	var resp *idempotency.Response
	now := r.now()
	err := postgres.WithTx(ctx, r.s.DB, func(tx *gorm.DB) error {
		resp = nil
		if apply {
			if _, err := r.s.applyTx(ctx, tx, r.o, ch, now); err != nil {
				return err
			}
		}
		cur, err := loadOrder(ctx, tx, r.o.TenantID, r.o.ID)
		if err != nil {
			return err
		}
		r.o = cur
		if r.claim == nil {
			return nil
		}
		if resp = responseFor(r.route, cur); resp == nil {
			return nil // nothing final yet; the caller waits
		}
		return r.s.Keys.Finish(ctx, tx, r.claim, resp)
	})
	if err != nil {
		if errors.Is(err, idempotency.ErrLeaseLost) {
			return nil, err
		}
		return r.stop(ctx, err)
	}
	if r.claim != nil && resp == nil {
		return r.stop(ctx, &waitError{reason: fmt.Sprintf("order %s is %s", r.o.ID, r.o.Status)})
	}
	return resp, nil
}

// applyTx applies ch to o inside tx through orders.Apply (the transition,
// the lifecycle's exit rule, the event), with what goes with it here: the
// stock given back (payment_failed, canceled). It reports whether the order
// changed.
func (s *Service) applyTx(ctx context.Context, tx *gorm.DB, o *Order, ch orders.Change, now time.Time) (bool, error) {
	cur, err := orders.Apply(ctx, tx, o.ID, ch, now)
	if err != nil || cur == nil {
		return false, err
	}
	if ch.To == orders.PaymentUnknown {
		s.Metrics.unknown()
	}
	if ch.To.LeavesTheWayToPaid() {
		if err := releaseStock(ctx, tx, cur); err != nil {
			return false, err
		}
	}
	s.Logger.InfoContext(ctx, "order status changed", "order_id", o.ID, "to", ch.To, "payment_intent", cur.Payment.PaymentIntentID)
	return true, nil
}

// stop ends a run that cannot settle now. A wait (Stripe unanswered or
// indeterminate) moves the order to payment_unknown once UnknownAfter has
// passed, and is answered 502; Stripe refusing our credentials is 503
// payment_provider_unavailable; a lost lease or attempt is 409 (another
// run owns the payment); anything else is 503. The executor
// (idempotency.Executor.Continue) releases the key's lease after any of
// them but the lost lease, so that a retry resumes at once.
func (r *run) stop(ctx context.Context, err error) (*idempotency.Response, error) {
	var w *waitError
	var refusal *PaymentRefusal
	switch {
	case errors.Is(err, stripestep.ErrTaken), errors.Is(err, idempotency.ErrLeaseLost):
		return nil, idempotency.ErrLeaseLost
	case errors.Is(err, ErrProviderCredentials):
		// Our own key, not the customer's payment: nothing failed, nothing
		// is stored, the stock stays reserved, and the retry resumes.
		r.s.Logger.ErrorContext(ctx, "Stripe refused the service's credentials (401/403): check STRIPE_SECRET_KEY",
			"order_id", r.o.ID, "err", err)
		return nil, providerCredentials(r.o.ID, err)
	case errors.As(err, &w), errors.Is(err, ErrProviderUnanswered), errors.Is(err, ErrProviderIndeterminate),
		errors.As(err, &refusal):
		r.markUnknown(ctx)
		e := paymentUnavailable(r.o.ID, err)
		if w != nil && !w.until.IsZero() {
			// Whole seconds, rounded up: a retry sooner only gets this 502.
			e.RetryAfter = max(1, int(math.Ceil(w.until.Sub(r.s.Now()).Seconds())))
		}
		return nil, e
	}
	return nil, r.s.translate(err)
}

// markUnknown moves a pending order whose payment has been unknown for
// UnknownAfter to payment_unknown. Best effort: the next run tries again.
func (r *run) markUnknown(ctx context.Context) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	cur, err := loadOrder(bg, r.s.DB, r.o.TenantID, r.o.ID)
	if err != nil || cur.Status != orders.PendingPayment || cur.UnknownSince == nil ||
		r.s.Now().Sub(*cur.UnknownSince) < r.cfg.UnknownAfter {
		return
	}
	err = postgres.WithTx(bg, r.s.DB, func(tx *gorm.DB) error {
		_, err := r.s.applyTx(bg, tx, cur, orders.Change{To: orders.PaymentUnknown}, r.now())
		return err
	})
	if err != nil {
		r.s.Logger.WarnContext(ctx, "mark payment unknown", "order_id", r.o.ID, "err", err)
		return
	}
	r.s.Logger.ErrorContext(ctx, "payment outcome unknown; the order is payment_unknown and is still reconciled",
		"order_id", r.o.ID, "since", cur.UnknownSince)
}
