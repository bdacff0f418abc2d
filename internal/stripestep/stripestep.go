// Package stripestep is the log of the service's Stripe steps and the
// rules every step shares, for the PaymentIntent saga (create, confirm,
// cancel) and the refund saga alike: the table payment_attempts (one row
// per attempt of one step, written before its call, finished after it),
// the outcomes an attempt records, how a step's idempotency key is derived,
// how long that key may be resent as it is, and how an answer from Stripe
// (a value or an error) becomes an outcome. It is the one package that
// reads and writes payment_attempts; both sagas and the sweep
// (internal/sweep) go through its Go API, so a fork changes each rule in
// one place.
package stripestep

import (
	"database/sql/driver"
	"fmt"
	"strconv"
	"time"
)

// Outcome is the outcome of one attempt of a step, as
// payment_attempts.outcome records it.
type Outcome string

// The outcomes of an attempt.
const (
	// Open (NULL in the table): sent, or about to be, with no final answer
	// recorded; its key may be resent as it is within ResendWindow.
	Open Outcome = ""
	// Succeeded: Stripe did what the step asked.
	Succeeded Outcome = "succeeded"
	// Failed: Stripe answered, and the customer's payment failed (a
	// decline, 402 card_error); the step is over.
	Failed Outcome = "failed"
	// Rejected: Stripe refused the request itself (a 4xx other than a
	// card error); never sent again.
	Rejected Outcome = "rejected"
	// Indeterminate: an answer Stripe stored under the key that says
	// nothing of the result (a 500, an idempotency_error); reconciled
	// with Stripe before any new attempt, never resent.
	Indeterminate Outcome = "indeterminate"
)

// Refused reports whether o is a final refusal by Stripe: Failed or
// Rejected.
func (o Outcome) Refused() bool { return o == Failed || o == Rejected }

// Value stores Open as NULL (database/sql/driver.Valuer).
func (o Outcome) Value() (driver.Value, error) {
	if o == Open {
		return nil, nil
	}
	return string(o), nil
}

// Scan reads NULL as Open (database/sql.Scanner).
func (o *Outcome) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*o = Open
	case string:
		*o = Outcome(v)
	case []byte:
		*o = Outcome(v)
	default:
		return fmt.Errorf("stripestep: scan outcome from %T", src)
	}
	return nil
}

// The steps of an order's PaymentIntent saga, as payment_attempts.step
// records them and Key derives them.
const (
	StepCreate  = "create"
	StepConfirm = "confirm"
	StepCancel  = "cancel"
)

// RefundStep returns the step of refund refundID of an order:
// "refund:{refund id}".
func RefundStep(refundID string) string { return "refund:" + refundID }

// StrayRefundStep returns the step of the refund of a stray PaymentIntent
// piID of an order, one that moved money for an order that is not paid:
// "stray-refund:{pi id}". Its attempt n is the refund sent after n-1
// refunds of it that Stripe failed (StrayRefunds lists the latest of
// each); Stripe refunds a PaymentIntent only up to what it charged, so no
// attempt can refund it twice.
func StrayRefundStep(piID string) string { return strayRefundPrefix + piID }

// strayRefundPrefix starts every StrayRefundStep; the partial index
// payment_attempts_stray_refunds (migration 00019) spells it too.
const strayRefundPrefix = "stray-refund:"

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
// Stripe (GET, list or search) instead of resent.
const ResendWindow = 23 * time.Hour
