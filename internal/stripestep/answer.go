package stripestep

import "errors"

// What a Stripe adapter's error says about one call of a step. The adapter
// (internal/payments) turns each Stripe answer into one of these, and
// OutcomeOf turns them into the outcome the step log records: the one
// mapping from Stripe's answers to outcomes, for every step of both sagas
// (https://docs.stripe.com/api/idempotent_requests,
// https://docs.stripe.com/error-low-level).
var (
	// ErrIndeterminate is wrapped when Stripe stored an answer under the
	// key that says nothing of the result: a 500 on a write ("including
	// 500 errors"), or an idempotency_error (the key was used with other
	// parameters). Resending the key replays it, and the request may still
	// be rolled forward: reconcile (GET, list, search) before any new
	// attempt. Outcome Indeterminate.
	ErrIndeterminate = errors.New("stripe stored an indeterminate answer under the key")
	// ErrUnanswered is wrapped when no final answer came within the
	// adapter's retry budget: network errors, timeouts, 409
	// idempotency_key_in_use or lock_timeout, 429 rate_limit, 503. Stripe
	// stored nothing we know of, and the request may have run: resending
	// the same key is safe while Stripe keeps it (ResendWindow). Outcome
	// Open.
	ErrUnanswered = errors.New("stripe gave no final answer")
	// ErrCredentials is wrapped when Stripe refused the service's own
	// credentials: 401 (an invalid or revoked secret key, as after a
	// rotation) or 403 (a restricted key without the permission)
	// (https://docs.stripe.com/error-codes). Authentication comes before
	// execution, so nothing is stored under the key and the customer's
	// payment was not refused: the attempt stays Open, to be sent again
	// once the key is fixed.
	ErrCredentials = errors.New("stripe refused our credentials")
	// ErrRejected is wrapped by a request refused as such without a
	// Refusal's details (one the adapter would not send: no idempotency
	// key). Outcome Rejected.
	ErrRejected = errors.New("stripe request rejected")
)

// Refusal is implemented by the error of Stripe's final refusal of one
// request (https://docs.stripe.com/api/errors): a card error or another
// 4xx (but 401, 403, 409 and 429). *checkout.PaymentRefusal is the one the
// adapter returns.
type Refusal interface {
	error
	// StepOutcome is Failed for a card error (402 card_error: a decline)
	// and Rejected for any other refusal.
	StepOutcome() Outcome
}

// OutcomeOf returns the outcome an attempt records for a call that
// returned err: Succeeded for nil; the Refusal's outcome (Failed or
// Rejected); Rejected for ErrRejected; Indeterminate for ErrIndeterminate;
// Open for anything else (ErrUnanswered, ErrCredentials, a context ended,
// any error the adapter did not classify): no final answer, so the same
// key may be sent again.
func OutcomeOf(err error) Outcome {
	var r Refusal
	switch {
	case err == nil:
		return Succeeded
	case errors.As(err, &r):
		return r.StepOutcome()
	case errors.Is(err, ErrRejected):
		return Rejected
	case errors.Is(err, ErrIndeterminate):
		return Indeterminate
	}
	return Open
}

// Final reports whether err is a final answer from Stripe to one call, one
// an adapter must not retry under the same key: a Refusal, ErrRejected,
// ErrIndeterminate (resending replays it) or ErrCredentials (nothing runs
// until the key is fixed).
func Final(err error) bool {
	return OutcomeOf(err) != Open || errors.Is(err, ErrCredentials)
}
