package checkout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripeintent"
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
	o     *orders.Order
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

func (s *Service) newRun(c *idempotency.Claim, route string, o *orders.Order) *run {
	return &run{s: s, cfg: s.Saga.withDefaults(), claim: c, route: route, o: o}
}

func (r *run) now() time.Time { return r.s.Now().UTC().Truncate(time.Microsecond) }

// fence returns the fence of the run's new attempts: the lease of the key
// it holds (none for the reconciler without a key).

// pay drives a checkout's payment from its persisted state to an outcome:
// create the PaymentIntent (or find the one an indeterminate create made),
// confirm it, and settle the order. It returns the response the key was
// finished with, or an error: a wait (502), a lost lease (409) or a failure
// of the database (503).
func (r *run) pay(ctx context.Context) (*idempotency.Response, error) {
	if !r.o.Status.Pending() {
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

// ensureIntent returns the order's PaymentIntent, creating it if needed, or
// a verdict when the create was refused.
func (r *run) ensureIntent(ctx context.Context) (PaymentIntentState, *verdict, error) {
	if id := r.o.Payment.PaymentIntentID; id != "" {
		return PaymentIntentState{ID: id, Status: r.o.Payment.Status}, nil, nil
	}
	newAttempts := r.created
	for {
		as, err := stripestep.Load(ctx, r.s.DB, r.o.ID, stripestep.StepCreate)
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
			pi := PaymentIntentState{ID: *last.StripeObjectID, Status: stripeintent.RequiresConfirmation}
			if last.StripeStatus != nil {
				pi.Status = stripeintent.Status(*last.StripeStatus)
			}
			return r.record(ctx, nil, pi)
		case last.Outcome.Refused():
			return PaymentIntentState{}, &verdict{refusal: refusalOf(last)}, nil
		case last.Resendable(r.s.Now()):
			// No final answer yet: Stripe either never saw the key or stored
			// an answer it replays. The same key is safe while Stripe keeps it.
			pi, v, err := r.create(ctx, last, false)
			if pi != nil || v != nil || err != nil {
				return stateOrZero(pi), v, err
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
				got, v, err := r.record(ctx, nil, pi)
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
		a := r.newAttempt(stripestep.StepCreate, next, "", r.createRequest(next))
		pi, v, err := r.create(ctx, a, true)
		if pi != nil || v != nil || err != nil {
			return stateOrZero(pi), v, err
		}
		// Indeterminate: loop to reconcile it.
	}
}

// stateOrZero returns *pi, or the zero state when the step found no
// PaymentIntent (pi nil).
func stateOrZero(pi *PaymentIntentState) PaymentIntentState {
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
	for _, rank := range []func(stripeintent.Status) bool{stripeintent.Status.MovesMoney,
		func(s stripeintent.Status) bool { return s == stripeintent.RequiresAction },
		func(s stripeintent.Status) bool { return s != stripeintent.Canceled }} {
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
		IdempotencyKey: stripestep.Key(r.o.ID, stripestep.StepCreate, n),
		Amount:         r.o.AmountTotal,
		Currency:       r.o.Currency,
		PaymentMethod:  r.o.PaymentMethod,
		OrderID:        r.o.ID,
		TenantID:       r.o.TenantID,
	}
}

// newAttempt returns the row of attempt n of step, not yet written.
func (r *run) newAttempt(step string, n int, target string, params any) *stripestep.Attempt {
	b, err := json.Marshal(params)
	if err != nil {
		panic("checkout: encode attempt params: " + err.Error()) // plain structs of strings and ints
	}
	return stripestep.NewAttempt(r.o.ID, r.o.TenantID, step, n, target, b, r.now())
}

// begin writes a new attempt before its call, fenced by the key's lease
// (one batch: the fence, then the attempt; a run without a key, the
// reconciler's, writes it unfenced). It returns stripestep.ErrTaken when
// the attempt was not written: another run wrote it, or holds the key.
func (r *run) begin(ctx context.Context, a *stripestep.Attempt) error {
	var b postgres.Batch
	r.claim.Fence().Queue(&b)
	stripestep.QueueInsert(&b, a)
	err := postgres.Send(ctx, r.s.DB, &b)
	if postgres.IsGuard(err, idempotency.GuardLeaseLost) || postgres.IsGuard(err, stripestep.GuardTaken) {
		return stripestep.ErrTaken
	}
	if err != nil {
		return fmt.Errorf("insert payment attempt %s: %w", a.IdempotencyKey, err)
	}
	return nil
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
	if err == nil {
		got, v, err := r.record(ctx, a, pi)
		return &got, v, err
	}
	switch res := r.recordAnswer(ctx, a, pi, err); {
	case res.err != nil:
		return nil, nil, res.err
	case res.refusal != nil:
		return nil, &verdict{refusal: res.refusal}, nil
	}
	return nil, nil, nil // indeterminate
}

// record makes pi the order's PaymentIntent unless it has one already,
// with created's answer pi when created is not nil (phase 2 without the
// confirm: queueIntentRecorded, sent pipelined).
func (r *run) record(ctx context.Context, created *stripestep.Attempt, pi PaymentIntentState) (PaymentIntentState, *verdict, error) {
	var b postgres.Batch
	recorded := r.queueIntentRecorded(&b, created, pi, nil, r.now())
	if err := postgres.Send(ctx, r.s.DB, &b); err != nil {
		return PaymentIntentState{}, nil, fmt.Errorf("record payment intent of %s: %w", r.o.ID, err)
	}
	id := *recorded
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

// recordAnswer records the answer (pi, callErr) to attempt a, with its
// outcome as stripestep.OutcomeOf gives it, and returns what the saga acts
// on: the PaymentIntent, a refusal, an indeterminate answer, or no answer.
// An indeterminate answer or none marks the order's payment unknown since
// now, unless a is a cancel (it moves no money) or Stripe refused our
// credentials (that says nothing of the payment).
func (r *run) recordAnswer(ctx context.Context, a *stripestep.Attempt, pi PaymentIntentState, callErr error) answerResult {
	unknown := a.Step != stripestep.StepCancel
	now := r.now()
	var res answerResult
	answer := stripestep.Answer{Outcome: stripestep.OutcomeOf(callErr)}
	if callErr != nil {
		answer.Error = callErr.Error()
	}
	switch answer.Outcome {
	case stripestep.Succeeded:
		answer.ObjectID, answer.Status = pi.ID, string(pi.Status)
	case stripestep.Failed, stripestep.Rejected:
		var refusal *PaymentRefusal
		if !errors.As(callErr, &refusal) { // stripestep.ErrRejected: no details
			refusal = &PaymentRefusal{Declined: answer.Outcome == stripestep.Failed, Message: callErr.Error()}
		}
		answer.Error = refusalText(refusal)
		if refusal.PaymentIntent != nil {
			answer.ObjectID, answer.Status = refusal.PaymentIntent.ID, string(refusal.PaymentIntent.Status)
		}
		res.refusal = refusal
	case stripestep.Indeterminate:
		if unknown {
			r.s.Logger.WarnContext(ctx, "stripe answered indeterminately; reconciling before any new attempt",
				"order_id", r.o.ID, "step", a.Step, "attempt", a.Attempt, "err", callErr)
		}
		res.indeterminate = true
	case stripestep.Open:
		if errors.Is(callErr, stripestep.ErrCredentials) {
			// Refused before executing: the attempt stays open, to be sent
			// again under its key; the payment is not unknown.
			unknown = false
			res.err = callErr
		} else {
			res.err = &waitError{reason: fmt.Sprintf("%s attempt %d of order %s: %v", a.Step, a.Attempt, r.o.ID, callErr)}
		}
	}
	dbErr := stripestep.Finish(ctx, r.s.DB, a, answer, now)
	if unknown && (answer.Outcome == stripestep.Indeterminate || answer.Outcome == stripestep.Open) {
		dbErr = errors.Join(dbErr, orders.MarkUnknownSince(ctx, r.s.DB, r.o.ID, now))
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
