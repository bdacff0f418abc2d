// Package stripestep holds the rules every Stripe step of the service's
// sagas shares, the PaymentIntent's (create, confirm, cancel) and the
// refund's: how a step's idempotency key is derived, how long that key may
// be resent as it is, and the outcomes an attempt records in
// payment_attempts. Both sagas take them from here, so a fork changes each
// rule in one place.
package stripestep

import (
	"strconv"
	"time"
)

// Outcomes of one attempt of a step, as payment_attempts.outcome records
// them (NULL until the call has answered).
const (
	// Succeeded: Stripe did what the step asked.
	Succeeded = "succeeded"
	// Failed: Stripe answered, and the customer's payment failed (a
	// decline); the step is over.
	Failed = "failed"
	// Rejected: Stripe refused the request itself (a 4xx other than a
	// card error); never sent again.
	Rejected = "rejected"
	// Indeterminate: no usable answer (a 5xx Stripe may have stored, a
	// timeout, a lost connection); reconciled with Stripe before any new
	// attempt.
	Indeterminate = "indeterminate"
)

// Key returns the Stripe Idempotency-Key of attempt n of step of the
// object objectID (an order): "{object}/{step}/{attempt}", e.g.
// "ord_0123…/confirm/2" or "ord_0123…/refund:ref_…/1".
//
// It is derived from persisted state alone (the object, the step and the
// attempt number recorded in payment_attempts before the call), never from
// a clock or a random source, so a resumed saga resends exactly the key it
// sent, and a new attempt always has a key Stripe has never seen. Order ids
// are unique, so a client key used again after IDEMPOTENCY_TTL, which gets
// a new order, never replays an old PaymentIntent.
func Key(objectID, step string, attempt int) string {
	return objectID + "/" + step + "/" + strconv.Itoa(attempt)
}

// ResendWindow is how long after an attempt was written its key may still
// be resent as it is: 23 hours. Stripe keeps an idempotency key for at
// least 24 hours and may prune it after
// (https://docs.stripe.com/api/idempotent_requests); a key it has forgotten
// runs as a new request, so an attempt older than this is reconciled with
// Stripe (GET or search) instead of resent.
const ResendWindow = 23 * time.Hour
