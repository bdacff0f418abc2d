package orders

import (
	"slices"
)

// Status is an order's status (orders.status), one of the constants below:
// every status CONTRACT.md names.
type Status string

// Order statuses (CONTRACT.md). Which one may follow which is the table
// next, and nothing else.
const (
	// PendingPayment: created (stock reserved), its payment not settled.
	PendingPayment Status = "pending_payment"
	// RequiresAction: waiting for the customer's 3D Secure.
	RequiresAction Status = "requires_action"
	// PaymentUnknown: Stripe has not told the outcome for
	// PAYMENT_UNKNOWN_AFTER; still reconciled.
	PaymentUnknown Status = "payment_unknown"
	// Paid: its PaymentIntent succeeded.
	Paid Status = "paid"
	// PaymentFailed: declined, refused, abandoned; stock released.
	PaymentFailed Status = "payment_failed"
	// Canceled: canceled by the customer in requires_action; stock released.
	Canceled Status = "canceled"
	// PartiallyRefunded: paid, and refunds that succeeded cover part of it.
	PartiallyRefunded Status = "partially_refunded"
	// Refunded: paid, and refunds that succeeded cover all of it.
	Refunded Status = "refunded"
)

// transitions is the order lifecycle: for each status, the statuses it may
// move to. No transition goes back, so whoever applies a change (the API,
// the completer, the reconciler, a webhook, a refund) and in whatever order,
// an order only moves forward. Every status is a key; a terminal one maps
// to nothing.
var transitions = map[Status][]Status{
	PendingPayment:    {RequiresAction, PaymentUnknown, Paid, PaymentFailed},
	PaymentUnknown:    {RequiresAction, Paid, PaymentFailed},
	RequiresAction:    {Paid, PaymentFailed, Canceled},
	Paid:              {PartiallyRefunded, Refunded},
	PartiallyRefunded: {Refunded},
	PaymentFailed:     nil,
	Canceled:          nil,
	Refunded:          nil,
}

// froms is transitions inverted: for each status, the statuses that may
// move to it, in the order of all. Apply's WHERE clause names them.
var froms = func() map[Status][]Status {
	m := map[Status][]Status{}
	for _, from := range all {
		for _, to := range transitions[from] {
			m[to] = append(m[to], from)
		}
	}
	return m
}()

// all lists every status in the order of the lifecycle.
var all = []Status{PendingPayment, PaymentUnknown, RequiresAction, Paid, PaymentFailed, Canceled, PartiallyRefunded, Refunded}

// All returns every status, in the order of the lifecycle.
func All() []Status { return slices.Clone(all) }

// Valid reports whether s is one of the statuses.
func (s Status) Valid() bool {
	_, ok := transitions[s]
	return ok
}

// CanMoveTo reports whether an order in s may move to to.
func (s Status) CanMoveTo(to Status) bool { return slices.Contains(transitions[s], to) }

// From returns the statuses an order may leave for to (none for
// pending_payment, where every order starts).
func From(to Status) []Status { return slices.Clone(froms[to]) }

// Waiting returns the statuses of an order still on the way to paid: those
// that may move to paid.
func Waiting() []Status { return From(Paid) }

// Waiting reports whether s is on the way to paid (see Waiting).
func (s Status) Waiting() bool { return s.CanMoveTo(Paid) }

// Pending returns the statuses in which the payment saga still has to reach
// Stripe (no answer that settles the payment yet): those that may still
// become requires_action.
func Pending() []Status { return From(RequiresAction) }

// Pending reports whether s is one of Pending.
func (s Status) Pending() bool { return s.CanMoveTo(RequiresAction) }

// Refundable reports whether an order in s may be refunded: it was paid and
// is not refunded in full (the statuses that may move to refunded).
func (s Status) Refundable() bool { return s.CanMoveTo(Refunded) }

// PaidOnce reports whether an order in s was paid: paid, or refunded (in
// part or in full) from paid. A checkout key answers 201 for it.
func (s Status) PaidOnce() bool { return s == Refunded || slices.Contains(froms[Refunded], s) }

// LeavesTheWayToPaid reports whether s is one an order reaches only by
// giving up on its payment (payment_failed, canceled): the lifecycle's
// exits, which Apply lets an order take only once its PaymentIntent is
// closed (Change.Closed).
func (s Status) LeavesTheWayToPaid() bool {
	return s != Paid && !s.Waiting() && !s.PaidOnce()
}

// Terminal reports whether s has no transition out of it.
func (s Status) Terminal() bool { return s.Valid() && len(transitions[s]) == 0 }

// Event returns the outbox event type (outbox.TypeOrder*) that an order
// moving to s emits, "" for none: the refund statuses have none of their
// own (refunds writes order.refunded, with the refund, for each refund that
// succeeds), nor do requires_action and payment_unknown.
func (s Status) Event() string { return events[s] }
