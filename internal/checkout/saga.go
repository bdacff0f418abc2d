package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripestep"
)

// SagaConfig tunes the payment saga. Zero fields take the defaults named in
// their comments, except SearchSettle, whose zero means "at once".
type SagaConfig struct {
	// SearchSettle is how long after an indeterminate create the saga waits
	// before it trusts a search by metadata['order_id'] (env
	// STRIPE_SEARCH_SETTLE, default 60s in the processes): Stripe's search
	// index lags behind writes by up to about a minute
	// (https://docs.stripe.com/search#data-freshness). Tests set it to the
	// emulator's STRIPE_EMULATOR_SEARCH_LAG.
	SearchSettle time.Duration
	// UnknownAfter is how long a payment may stay unanswered or
	// indeterminate before its order becomes payment_unknown (env
	// PAYMENT_UNKNOWN_AFTER, default 1h). Such an order is still reconciled.
	UnknownAfter time.Duration
	// ActionTimeout is how long an order may wait in requires_action for
	// the customer (env PAYMENT_ACTION_TIMEOUT, default 30m); then the
	// reconciler cancels its PaymentIntent, whatever its status short of
	// moving money, and the order fails.
	ActionTimeout time.Duration
	// MaxAttempts caps the new attempts of one step within one run (default
	// 4); the run then answers 502 and a later run goes on.
	MaxAttempts int
}

func (c SagaConfig) withDefaults() SagaConfig {
	if c.UnknownAfter <= 0 {
		c.UnknownAfter = time.Hour
	}
	if c.ActionTimeout <= 0 {
		c.ActionTimeout = 30 * time.Minute
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 4
	}
	if c.SearchSettle < 0 {
		c.SearchSettle = 0
	}
	return c
}

// run is one execution of an order's payment saga, by the API, the
// completer or the reconciler.
type run struct {
	s   *Service
	cfg SagaConfig
	// claim is the idempotency key this run holds, nil for the reconciler
	// on an order whose key is finished (requires_action). Its lease fences
	// the run's new attempts and its final write.
	claim *idempotency.Claim
	// route decides the response the key is finished with.
	route string
	o     *Order
	// created and confirmed count the create and confirm attempts this
	// run wrote before it took the general path (a first execution's):
	// they count toward MaxAttempts like the general path's own.
	created, confirmed int
}

// verdict is what the saga learned and must apply to the order: a
// PaymentIntent's state, or a final refusal.
type verdict struct {
	pi      *PaymentIntentState
	refusal *PaymentRefusal
}

// waitError means the saga cannot go on now: Stripe gave no answer, an
// indeterminate answer cannot be reconciled yet, or money is still moving.
// until, when set, is the earliest time a new run can get further (Stripe's
// search settling); the 502 tells the client so in its Retry-After.
type waitError struct {
	reason string
	until  time.Time
}

func (e *waitError) Error() string { return e.reason }

func (s *Service) newRun(c *idempotency.Claim, route string, o *Order) *run {
	return &run{s: s, cfg: s.Saga.withDefaults(), claim: c, route: route, o: o}
}

func (r *run) now() time.Time { return r.s.Now().UTC().Truncate(time.Microsecond) }

// fence returns the fence of the run's new attempts: the lease of the key
// it holds (none for the reconciler without a key).
func (r *run) fence() stripestep.Fence {
	if r.claim == nil {
		return stripestep.Fence{}
	}
	return leaseFence(r.claim.ID, r.claim.Owner)
}

// pay drives a checkout's payment from its persisted state to an outcome:
// create the PaymentIntent (or find the one an indeterminate create made),
// confirm it, and settle the order. It returns the response the key was
// finished with, or an error: a wait (502), a lost lease (409) or a failure
// of the database (503).
func (r *run) pay(ctx context.Context) (*idempotency.Response, error) {
	if !pending(r.o.Status) {
		return r.settle(ctx, nil) // settled by another path (a webhook, the reconciler): finish the key
	}
	pi, v, err := r.ensureIntent(ctx)
	if err != nil {
		return r.stop(ctx, err)
	}
	if v == nil {
		if v, err = r.confirm(ctx, pi); err != nil {
			return r.stop(ctx, err)
		}
	}
	return r.settle(ctx, v)
}

// pending reports the statuses in which the saga still has to reach Stripe.
func pending(status string) bool {
	return status == StatusPendingPayment || status == StatusPaymentUnknown
}

// ensureIntent returns the order's PaymentIntent, creating it if needed, or
// a verdict when the create was refused.
func (r *run) ensureIntent(ctx context.Context) (PaymentIntentState, *verdict, error) {
	if id := r.o.Payment.PaymentIntentID; id != "" {
		return PaymentIntentState{ID: id, Status: r.o.Payment.Status}, nil, nil
	}
	newAttempts := r.created
	for {
		as, err := stripestep.Load(ctx, r.s.DB, r.o.ID, StepCreate)
		if err != nil {
			return PaymentIntentState{}, nil, err
		}
		var last *stripestep.Attempt
		if len(as) > 0 {
			last = &as[len(as)-1]
		}
		next := 1
		switch {
		case last == nil:
		case last.Outcome == stripestep.Succeeded && last.StripeObjectID != nil:
			// Answered, but the run stopped before recording it on the order.
			pi := PaymentIntentState{ID: *last.StripeObjectID, Status: PIRequiresConfirmation}
			if last.StripeStatus != nil {
				pi.Status = *last.StripeStatus
			}
			return r.record(ctx, pi)
		case last.Outcome.Refused():
			return PaymentIntentState{}, &verdict{refusal: refusalOf(last)}, nil
		case last.Resendable(r.s.Now()):
			// No final answer yet: Stripe either never saw the key or stored
			// an answer it replays. The same key is safe while Stripe keeps it.
			pi, v, err := r.create(ctx, last, false)
			if pi != nil || v != nil || err != nil {
				return deref(pi), v, err
			}
			continue
		default:
			// Indeterminate (a stored 500), or unanswered with a key Stripe
			// may have pruned: reconcile before any new attempt. The search
			// is trusted once the index has caught up with the attempt's
			// last answer (anything it created existed by then).
			if settled := last.UpdatedAt.Add(r.cfg.SearchSettle); r.s.Now().Before(settled) {
				return PaymentIntentState{}, nil, &waitError{reason: fmt.Sprintf(
					"create attempt %d of order %s is indeterminate; Stripe's search settles at %s", last.Attempt, r.o.ID, settled.Format(time.RFC3339)),
					until: settled}
			}
			found, err := r.s.Payments.SearchPaymentIntents(ctx, r.o.ID)
			if err != nil {
				return PaymentIntentState{}, nil, err
			}
			if pi, ok := adoptable(found); ok {
				r.s.Logger.InfoContext(ctx, "adopting the PaymentIntent an indeterminate create made",
					"order_id", r.o.ID, "payment_intent", pi.ID, "found", len(found))
				got, v, err := r.record(ctx, pi)
				if err == nil {
					r.cancelOrphans(ctx, found, got.ID)
				}
				return got, v, err
			}
			next = last.Attempt + 1
		}
		if newAttempts == r.cfg.MaxAttempts {
			return PaymentIntentState{}, nil, &waitError{reason: fmt.Sprintf("create of order %s: %d new attempts in one run", r.o.ID, newAttempts)}
		}
		newAttempts++
		a := r.newAttempt(StepCreate, next, "", r.createRequest(next))
		pi, v, err := r.create(ctx, a, true)
		if pi != nil || v != nil || err != nil {
			return deref(pi), v, err
		}
		// Indeterminate: loop to reconcile it.
	}
}

func deref(pi *PaymentIntentState) PaymentIntentState {
	if pi == nil {
		return PaymentIntentState{}
	}
	return *pi
}

// adoptable picks, among the PaymentIntents a search found for the order,
// the one to keep: one that moves money (there is at most one: only a
// recorded PaymentIntent is ever confirmed), else one waiting for the
// customer, else the oldest that is not canceled.
func adoptable(found []PaymentIntentState) (PaymentIntentState, bool) {
	for _, rank := range []func(string) bool{MovesMoney, func(s string) bool { return s == PIRequiresAction },
		func(s string) bool { return s != PICanceled }} {
		for _, pi := range found {
			if rank(pi.Status) {
				return pi, true
			}
		}
	}
	return PaymentIntentState{}, false
}

func (r *run) createRequest(n int) CreateIntentRequest {
	return CreateIntentRequest{
		IdempotencyKey: stripestep.Key(r.o.ID, StepCreate, n),
		Amount:         r.o.AmountTotal,
		Currency:       r.o.Currency,
		PaymentMethod:  r.o.paymentMethod,
		OrderID:        r.o.ID,
		TenantID:       r.o.tenantID,
	}
}

// newAttempt returns the row of attempt n of step, not yet written.
func (r *run) newAttempt(step string, n int, target string, params any) *stripestep.Attempt {
	b, err := json.Marshal(params)
	if err != nil {
		panic("checkout: encode attempt params: " + err.Error()) // plain structs of strings and ints
	}
	return stripestep.NewAttempt(r.o.ID, r.o.tenantID, step, n, target, b, r.now())
}

// begin writes a new attempt before its call (fenced by the key's lease).
func (r *run) begin(ctx context.Context, a *stripestep.Attempt) error {
	return stripestep.Insert(ctx, r.s.DB, a, r.fence())
}

// create sends create attempt a (written first when isNew) and records the
// answer. It returns the PaymentIntent, a verdict (refused), an error
// (unanswered: wait), or all nil after an indeterminate answer, which the
// caller reconciles.
func (r *run) create(ctx context.Context, a *stripestep.Attempt, isNew bool) (*PaymentIntentState, *verdict, error) {
	if isNew {
		if err := r.begin(ctx, a); err != nil {
			return nil, nil, err
		}
	}
	pi, err := r.s.Payments.CreatePaymentIntent(ctx, r.createRequest(a.Attempt))
	switch res := r.answer(ctx, a, pi, err); {
	case res.err != nil:
		return nil, nil, res.err
	case res.refusal != nil:
		return nil, &verdict{refusal: res.refusal}, nil
	case res.indeterminate:
		return nil, nil, nil
	}
	got, v, err := r.record(ctx, pi)
	return &got, v, err
}

// record makes pi the order's PaymentIntent unless it has one already.
func (r *run) record(ctx context.Context, pi PaymentIntentState) (PaymentIntentState, *verdict, error) {
	id, err := recordIntent(ctx, r.s.DB, r.o.ID, pi, r.now())
	if err != nil {
		return PaymentIntentState{}, nil, err
	}
	r.o.Payment.PaymentIntentID = id
	if id != pi.ID {
		// Another run recorded another one first: this one is an orphan.
		r.cancelOrphans(ctx, []PaymentIntentState{pi}, id)
		return PaymentIntentState{ID: id}, nil, nil
	}
	r.o.Payment.Status = pi.Status
	return pi, nil, nil
}

// answerResult is an attempt's answer after it was recorded.
type answerResult struct {
	refusal       *PaymentRefusal
	indeterminate bool
	err           error // unanswered (a waitError), or the database failing
}

// answer records the answer to attempt a: the PaymentIntent, a refusal, an
// indeterminate answer (which marks the payment unknown since now), or no
// answer (the same, unless Stripe refused our credentials: that says
// nothing of the payment).
func (r *run) answer(ctx context.Context, a *stripestep.Attempt, pi PaymentIntentState, callErr error) answerResult {
	return r.recordAnswer(ctx, a, pi, callErr, true)
}

// recordAnswer records the answer (pi, callErr) to attempt a, with its
// outcome as stripestep.OutcomeOf gives it, and returns what the saga acts
// on. unknown says whether no final answer marks the order's payment
// unknown (not for a cancel: it moves no money).
func (r *run) recordAnswer(ctx context.Context, a *stripestep.Attempt, pi PaymentIntentState, callErr error, unknown bool) answerResult {
	now := r.now()
	var res answerResult
	answer := stripestep.Answer{Outcome: stripestep.OutcomeOf(callErr)}
	if callErr != nil {
		answer.Error = callErr.Error()
	}
	switch answer.Outcome {
	case stripestep.Succeeded:
		answer.ObjectID, answer.Status = pi.ID, pi.Status
	case stripestep.Failed, stripestep.Rejected:
		var refusal *PaymentRefusal
		if !errors.As(callErr, &refusal) { // stripestep.ErrRejected: no details
			refusal = &PaymentRefusal{Declined: answer.Outcome == stripestep.Failed, Message: callErr.Error()}
		}
		answer.Error = refusalText(refusal)
		if refusal.PaymentIntent != nil {
			answer.ObjectID, answer.Status = refusal.PaymentIntent.ID, refusal.PaymentIntent.Status
		}
		res.refusal = refusal
	case stripestep.Indeterminate:
		if unknown {
			r.s.Logger.WarnContext(ctx, "stripe answered indeterminately; reconciling before any new attempt",
				"order_id", r.o.ID, "step", a.Step, "attempt", a.Attempt, "err", callErr)
		}
		res.indeterminate = true
	case stripestep.Open:
		if errors.Is(callErr, ErrProviderCredentials) {
			// Refused before executing: the attempt stays open, to be sent
			// again under its key; the payment is not unknown.
			unknown = false
			res.err = callErr
		} else {
			res.err = &waitError{reason: fmt.Sprintf("%s attempt %d of order %s: %v", a.Step, a.Attempt, r.o.ID, callErr)}
		}
	}
	dbErr := stripestep.Finish(ctx, r.s.DB, a.ID, answer, now)
	if unknown && (answer.Outcome == stripestep.Indeterminate || answer.Outcome == stripestep.Open) {
		dbErr = errors.Join(dbErr, markUnknownSince(ctx, r.s.DB, r.o.ID, now))
	}
	if dbErr != nil {
		res.err = dbErr
	}
	return res
}

// refusalText is what payment_attempts.error keeps of a refusal: enough to
// rebuild the verdict on resume ("code|decline_code|message").
func refusalText(e *PaymentRefusal) string {
	return e.Code + "|" + e.DeclineCode + "|" + e.Error()
}

// refusalOf rebuilds the refusal recorded on a failed or rejected attempt.
func refusalOf(a *stripestep.Attempt) *PaymentRefusal {
	r := &PaymentRefusal{Declined: a.Outcome == stripestep.Failed}
	if a.Error != nil {
		parts := strings.SplitN(*a.Error, "|", 3)
		for len(parts) < 3 {
			parts = append(parts, "")
		}
		r.Code, r.DeclineCode, r.Message = parts[0], parts[1], parts[2]
	}
	return r
}

// confirm confirms the order's PaymentIntent pi and returns the verdict to
// apply. After an indeterminate confirm (or one whose key may have been
// pruned) it reads the PaymentIntent by id and confirms again, under the
// next attempt's key, only if Stripe says it is still unconfirmed.
func (r *run) confirm(ctx context.Context, pi PaymentIntentState) (*verdict, error) {
	newAttempts := r.confirmed
	for {
		all, err := stripestep.Load(ctx, r.s.DB, r.o.ID, StepConfirm)
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
		case last == nil && (pi.Status == PIRequiresConfirmation || pi.Status == ""):
		case last == nil:
			// Adopted in another state: Stripe's state is the truth.
			cur, err := r.s.Payments.RetrievePaymentIntent(ctx, pi.ID)
			if err != nil {
				return nil, err
			}
			if cur.Status != PIRequiresConfirmation {
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
			if cur.Status != PIRequiresConfirmation {
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
		a := r.newAttempt(StepConfirm, maxN+1, pi.ID, ConfirmIntentRequest{PaymentIntentID: pi.ID, ReturnURL: r.o.returnURL})
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
		IdempotencyKey: a.IdempotencyKey, PaymentIntentID: piID, ReturnURL: r.o.returnURL})
	return r.confirmAnswered(ctx, piID, a, got, err)
}

// confirmAnswered records the answer (got, err) to confirm attempt a of
// PaymentIntent piID and returns what confirmAttempt does.
func (r *run) confirmAnswered(ctx context.Context, piID string, a *stripestep.Attempt, got PaymentIntentState, err error) (*verdict, error) {
	res := r.answer(ctx, a, got, err)
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
		if cur.Status == PIRequiresConfirmation {
			return &verdict{refusal: res.refusal}, nil
		}
		return r.verdictOf(cur)
	}
	return r.verdictOf(got)
}

// verdictOf returns the verdict for a PaymentIntent's state, or a wait when
// the state settles nothing yet (processing, requires_capture).
func (r *run) verdictOf(pi PaymentIntentState) (*verdict, error) {
	if _, ok := r.changeFor(pi, false); !ok {
		return nil, &waitError{reason: fmt.Sprintf("payment intent %s of order %s is %s", pi.ID, r.o.ID, pi.Status)}
	}
	return &verdict{pi: &pi}, nil
}

// changeFor returns the order change Stripe's state of the order's
// PaymentIntent calls for, and false when it calls for none.
// customerCanceled says whether the customer asked for the cancellation.
func (r *run) changeFor(pi PaymentIntentState, customerCanceled bool) (change, bool) {
	ch := change{paymentIntentID: pi.ID, paymentStatus: pi.Status}
	switch pi.Status {
	case PISucceeded:
		ch.to = StatusPaid
	case PIRequiresAction:
		ch.to, ch.nextAction, ch.clientSecret = StatusRequiresAction, pi.NextAction, pi.ClientSecret
	case PIRequiresPaymentMethod:
		if !failedAttempt(pi) {
			return ch, false // never confirmed
		}
		// Open for another attempt: closeBeforeExit cancels it first.
		ch.to, ch.failureCode, ch.declineCode = StatusPaymentFailed, CodeCardDeclined, firstOf(pi.LastDeclineCode, pi.LastErrorCode)
	case PICanceled:
		switch {
		case customerCanceled || pi.CancellationReason == CancelRequestedByCustomer:
			ch.to, ch.failureCode = StatusCanceled, "canceled"
		case pi.CancellationReason == CancelAbandoned && failedAttempt(pi):
			// Closed by closeBeforeExit after a failed attempt.
			ch.to, ch.failureCode, ch.declineCode = StatusPaymentFailed, CodeCardDeclined, firstOf(pi.LastDeclineCode, pi.LastErrorCode)
		case pi.CancellationReason == CancelAbandoned:
			ch.to, ch.failureCode = StatusPaymentFailed, "payment_action_timeout"
		default:
			ch.to, ch.failureCode = StatusPaymentFailed, "payment_canceled"
		}
	default:
		return ch, false
	}
	return ch, true
}

// failedAttempt reports whether pi's latest confirmation failed: Stripe
// then sets last_payment_error (a decline, a failed 3D Secure challenge).
func failedAttempt(pi PaymentIntentState) bool {
	return pi.LastErrorCode != "" || pi.LastDeclineCode != ""
}

// leavesTheWayToPaid reports whether status is one an order reaches only by
// giving up on its payment: payment_failed, canceled.
func leavesTheWayToPaid(status string) bool {
	return status == StatusPaymentFailed || status == StatusCanceled
}

// errPaymentOpen is applyTx's refusal of a change that leaves the way to
// paid while the order's PaymentIntent may still move money: every path
// closes it first (closeBeforeExit), so this is a bug, never an outcome.
var errPaymentOpen = errors.New("the order's PaymentIntent is not closed")

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
func (r *run) closeBeforeExit(ctx context.Context, ch change) (change, error) {
	if !leavesTheWayToPaid(ch.to) || ch.closed {
		return ch, nil
	}
	id := r.o.Payment.PaymentIntentID
	switch {
	case ch.paymentStatus == PICanceled, id == "" && ch.paymentIntentID == "":
		ch.closed = true
		return ch, nil
	case !slices.Contains(transitionFrom[ch.to], r.o.Status):
		return ch, nil // already settled: nothing to leave (statuses only move forward)
	case id == "":
		id = ch.paymentIntentID
	}
	r.s.Logger.InfoContext(ctx, "closing the order's PaymentIntent before the order leaves the way to paid",
		"order_id", r.o.ID, "payment_intent", id, "to", ch.to, "code", firstOf(ch.declineCode, ch.failureCode))
	got, err := r.cancel(ctx, id, CancelAbandoned)
	if err != nil {
		return ch, fmt.Errorf("close the payment of order %s before it is %s: %w", r.o.ID, ch.to, err)
	}
	if got.Status == PICanceled {
		ch.paymentIntentID, ch.paymentStatus, ch.closed = id, PICanceled, true
		return ch, nil
	}
	// Stripe refused the cancel: the PaymentIntent moved on.
	moved, ok := r.changeFor(got, false)
	if !ok || leavesTheWayToPaid(moved.to) {
		return ch, &waitError{reason: fmt.Sprintf("payment intent %s of order %s is %s and cannot be canceled", id, r.o.ID, got.Status)}
	}
	r.s.Logger.WarnContext(ctx, "the order's PaymentIntent moved on before it could be closed; applying Stripe's state",
		"order_id", r.o.ID, "payment_intent", id, "status", got.Status, "instead_of", ch.to)
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
func (r *run) changeOf(ctx context.Context, v *verdict) (change, bool, error) {
	if f := v.refusal; f != nil {
		ch := change{to: StatusPaymentFailed, failureCode: CodePaymentRejected}
		if v.pi != nil {
			ch.paymentIntentID, ch.paymentStatus = v.pi.ID, v.pi.Status
		}
		if f.Declined {
			ch.failureCode, ch.declineCode = CodeCardDeclined, firstOf(f.DeclineCode, f.Code)
		}
		return ch, true, nil
	}
	customer := false
	if v.pi.Status == PICanceled {
		var err error
		if customer, err = customerCanceled(ctx, r.s.DB, r.o.ID, v.pi.ID); err != nil {
			return change{}, false, err
		}
	}
	ch, ok := r.changeFor(*v.pi, customer)
	return ch, ok, nil
}

// customerCanceled reports whether the order's PaymentIntent piID was
// canceled at the customer's request (POST /v1/orders/{id}/cancel).
func customerCanceled(ctx context.Context, db *gorm.DB, orderID, piID string) (bool, error) {
	return stripestep.Sent(ctx, db, orderID, StepCancel, piID, "cancellation_reason", CancelRequestedByCustomer)
}

// settle applies v (if any) to the order in one transaction, monotonically:
// the status change, the stock given back, the event, and, when the run
// holds a key, the key finished with the response the order's state calls
// for. It returns that response (nil without a key).
func (r *run) settle(ctx context.Context, v *verdict) (*idempotency.Response, error) {
	var ch change
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
		cur, err := loadOrder(ctx, tx, r.o.tenantID, r.o.ID)
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

// applyTx applies ch to o inside tx if the order may move there, with what
// goes with it: the stock given back (payment_failed, canceled) and the
// event. It reports whether the order changed.
func (s *Service) applyTx(ctx context.Context, tx *gorm.DB, o *Order, ch change, now time.Time) (bool, error) {
	if leavesTheWayToPaid(ch.to) && !ch.closed && ch.paymentStatus != PICanceled {
		// The lifecycle's rule (closeBeforeExit), checked where every
		// change is written: no exit while the PaymentIntent is open.
		cur, err := loadOrder(ctx, tx, o.tenantID, o.ID)
		if err != nil {
			return false, err
		}
		if !slices.Contains(transitionFrom[ch.to], cur.Status) {
			return false, nil // already past: the change applies nowhere
		}
		if cur.Payment.PaymentIntentID != "" || ch.paymentIntentID != "" {
			return false, fmt.Errorf("order %s to %s: %w", o.ID, ch.to, errPaymentOpen)
		}
	}
	changed, err := transition(ctx, tx, o.ID, ch, now)
	if err != nil || !changed {
		return false, err
	}
	cur, err := loadOrder(ctx, tx, o.tenantID, o.ID)
	if err != nil {
		return false, err
	}
	var event string
	switch ch.to {
	case StatusPaid:
		event = outbox.TypeOrderPaid
	case StatusPaymentFailed:
		event = outbox.TypeOrderPaymentFailed
	case StatusCanceled:
		event = outbox.TypeOrderCanceled
	case StatusPaymentUnknown:
		s.Metrics.unknown()
	}
	if ch.to == StatusPaymentFailed || ch.to == StatusCanceled {
		if err := releaseStock(ctx, tx, cur); err != nil {
			return false, err
		}
	}
	if event != "" {
		if err := outbox.Add(ctx, tx, s.event(event, cur, now)); err != nil {
			return false, err
		}
	}
	s.Logger.InfoContext(ctx, "order status changed", "order_id", o.ID, "to", ch.to, "payment_intent", cur.Payment.PaymentIntentID)
	return true, nil
}

// stop ends a run that cannot settle now. A wait (Stripe unanswered or
// indeterminate) releases the key's lease so that a retry resumes at once,
// moves the order to payment_unknown once UnknownAfter has passed, and is
// answered 502; Stripe refusing our credentials is 503
// payment_provider_unavailable, the key released the same way; a lost lease
// or attempt is 409 (another run owns the payment); anything else is 503.
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
		r.release()
		return nil, providerCredentials(r.o.ID, err)
	case errors.As(err, &w), errors.Is(err, ErrProviderUnanswered), errors.Is(err, ErrProviderIndeterminate),
		errors.As(err, &refusal):
		r.markUnknown(ctx)
		r.release()
		e := paymentUnavailable(r.o.ID, err)
		if w != nil && !w.until.IsZero() {
			// Whole seconds, rounded up: a retry sooner only gets this 502.
			e.RetryAfter = max(1, int(math.Ceil(w.until.Sub(r.s.Now()).Seconds())))
		}
		return nil, e
	}
	r.release()
	return nil, r.s.translate(err)
}

// markUnknown moves a pending order whose payment has been unknown for
// UnknownAfter to payment_unknown. Best effort: the next run tries again.
func (r *run) markUnknown(ctx context.Context) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	cur, err := loadOrder(bg, r.s.DB, r.o.tenantID, r.o.ID)
	if err != nil || cur.Status != StatusPendingPayment || cur.unknownSince == nil ||
		r.s.Now().Sub(*cur.unknownSince) < r.cfg.UnknownAfter {
		return
	}
	err = postgres.WithTx(bg, r.s.DB, func(tx *gorm.DB) error {
		_, err := r.s.applyTx(bg, tx, cur, change{to: StatusPaymentUnknown}, r.now())
		return err
	})
	if err != nil {
		r.s.Logger.WarnContext(ctx, "mark payment unknown", "order_id", r.o.ID, "err", err)
		return
	}
	r.s.Logger.ErrorContext(ctx, "payment outcome unknown; the order is payment_unknown and is still reconciled",
		"order_id", r.o.ID, "since", cur.unknownSince)
}

// release ends the key's lease early, so that the client's retry resumes at
// once rather than after the lease expires.
func (r *run) release() {
	if r.claim != nil {
		r.s.release(r.claim)
	}
}

// cancelOrphans cancels, best effort, every PaymentIntent of found other
// than keep that does not move money: orphans of indeterminate creates.
// They were never confirmed, so they are harmless until then; a failure is
// logged and the next reconciliation finds them again.
func (r *run) cancelOrphans(ctx context.Context, found []PaymentIntentState, keep string) {
	for _, pi := range found {
		if pi.ID == keep || pi.Status == PICanceled || MovesMoney(pi.Status) {
			if pi.ID != keep && MovesMoney(pi.Status) {
				// A second one moving money: stray, refunded.
				o := *r.o
				o.Payment.PaymentIntentID = keep
				if err := r.s.settleStray(ctx, &o, pi); err != nil {
					r.s.Logger.WarnContext(ctx, "refund a stray payment", "order_id", r.o.ID, "payment_intent", pi.ID, "err", err)
				}
			}
			continue
		}
		if _, err := r.cancel(ctx, pi.ID, CancelDuplicate); err != nil {
			r.s.Logger.WarnContext(ctx, "cancel orphan PaymentIntent", "order_id", r.o.ID, "payment_intent", pi.ID, "err", err)
		}
	}
}

// cancel cancels PaymentIntent piID of the order with reason and returns
// Stripe's state of it afterwards: canceled, or whatever state made the
// cancellation impossible (succeeded, say). Indeterminate answers are
// reconciled with a GET before a new attempt.
func (r *run) cancel(ctx context.Context, piID, reason string) (PaymentIntentState, error) {
	newAttempts := 0
	raced := false
	for {
		all, err := stripestep.Load(ctx, r.s.DB, r.o.ID, StepCancel)
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
			if !cancelable(cur.Status) {
				return cur, nil
			}
		}
		if a == nil {
			if newAttempts == r.cfg.MaxAttempts {
				return PaymentIntentState{}, &waitError{reason: fmt.Sprintf("cancel of %s: %d new attempts in one run", piID, newAttempts)}
			}
			newAttempts++
			a = r.newAttempt(StepCancel, maxN+1, piID, CancelIntentRequest{PaymentIntentID: piID, Reason: reason})
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
		res := r.answerCancel(ctx, a, got, err)
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

// answerCancel records a cancel's answer like answer, without marking the
// order's payment unknown: a cancellation moves no money.
func (r *run) answerCancel(ctx context.Context, a *stripestep.Attempt, pi PaymentIntentState, callErr error) answerResult {
	return r.recordAnswer(ctx, a, pi, callErr, false)
}

// cancelable reports the PaymentIntent statuses Stripe lets a caller cancel
// (https://docs.stripe.com/api/payment_intents/cancel); processing, which
// Stripe allows only in rare cases, is left to settle.
func cancelable(status string) bool {
	switch status {
	case PIRequiresPaymentMethod, PIRequiresConfirmation, PIRequiresAction, PIRequiresCapture:
		return true
	}
	return false
}
