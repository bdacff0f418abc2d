// Package stripeintent is Stripe's vocabulary of a PaymentIntent's status
// (https://docs.stripe.com/payments/paymentintents/lifecycle), in one
// place: the typed Status and the rules the service reads off it (does it
// move money, can it still change, may it be canceled).
//
// It is its own leaf package, not part of internal/payments, because the
// packages that need the rules sit below payments: payments implements
// checkout.PaymentProvider and so imports checkout, which imports orders;
// orders, webhooks and checkout can all import a leaf without a cycle.
// Nothing outside this package writes a status as a string literal
// (internal/architecture checks it).
package stripeintent

import "slices"

// Status is the status of a Stripe PaymentIntent
// (https://docs.stripe.com/api/payment_intents/object#payment_intent_object-status),
// one of the constants below.
type Status string

// PaymentIntent statuses, in the order Stripe's lifecycle page draws them.
const (
	// RequiresPaymentMethod: created without a payment method, or its
	// latest attempt failed (last_payment_error says why); it can be
	// confirmed again.
	RequiresPaymentMethod Status = "requires_payment_method"
	// RequiresConfirmation: has a payment method, not confirmed yet.
	RequiresConfirmation Status = "requires_confirmation"
	// RequiresAction: the customer must act (3D Secure; next_action).
	RequiresAction Status = "requires_action"
	// Processing: the payment is under way (asynchronous methods).
	Processing Status = "processing"
	// RequiresCapture: authorized, to be captured.
	RequiresCapture Status = "requires_capture"
	// Canceled: canceled; terminal.
	Canceled Status = "canceled"
	// Succeeded: the money moved; terminal.
	Succeeded Status = "succeeded"
)

// all lists every status in the lifecycle's order.
var all = []Status{RequiresPaymentMethod, RequiresConfirmation, RequiresAction, Processing, RequiresCapture, Canceled, Succeeded}

// All returns every status, in the lifecycle's order.
func All() []Status { return slices.Clone(all) }

// Valid reports whether s is one of the statuses.
func (s Status) Valid() bool { return slices.Contains(all, s) }

// MovesMoney reports whether a PaymentIntent in s has moved, or is moving,
// money: succeeded, processing or requires_capture. At most one
// PaymentIntent per order may ever be in one of them (CONTRACT.md).
func (s Status) MovesMoney() bool {
	return s == Succeeded || s == Processing || s == RequiresCapture
}

// Final reports whether a PaymentIntent in s can no longer change:
// succeeded and canceled are terminal at Stripe; every other status can
// still move, e.g. requires_payment_method to succeeded when it is
// confirmed again.
func (s Status) Final() bool { return s == Succeeded || s == Canceled }

// Cancelable reports whether the service cancels a PaymentIntent in s:
// requires_payment_method, requires_confirmation, requires_action or
// requires_capture (https://docs.stripe.com/api/payment_intents/cancel).
// Stripe also cancels a processing one "in rare cases"; the service never
// tries, since processing moves money.
func (s Status) Cancelable() bool {
	return s == RequiresPaymentMethod || s == RequiresConfirmation || s == RequiresAction || s == RequiresCapture
}
