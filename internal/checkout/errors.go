package checkout

import (
	"fmt"

	"github.com/onceonly/checkout/internal/problem"
)

// Failure codes: why an order left the way to paid (orders.Order.FailureCode,
// from which responseFor answers its checkout key). The first two are the
// problem codes the key is answered with, as the strings the order stores.
const (
	// CodeCardDeclined: the card was declined (problem.CodeCardDeclined).
	CodeCardDeclined = string(problem.CodeCardDeclined)
	// CodePaymentRejected: Stripe refused the payment request
	// (problem.CodePaymentRejected).
	CodePaymentRejected = string(problem.CodePaymentRejected)
	// FailureActionTimeout: the customer did not complete the payment's
	// next action (3D Secure) within PAYMENT_ACTION_TIMEOUT.
	FailureActionTimeout = "payment_action_timeout"
	// FailurePaymentCanceled: the PaymentIntent was canceled at Stripe by
	// someone other than this service (the Dashboard, say).
	FailurePaymentCanceled = "payment_canceled"
	// FailureCanceled: the customer canceled the order (POST
	// /v1/orders/{id}/cancel); the order is canceled, not payment_failed.
	FailureCanceled = "canceled"
)

// The checkout domain's coded errors (internal/problem's error model: a
// Code and a detail, never an HTTP status; the problem table gives each its
// status, title and Retry-After). A cause is attached with problem.Wrap,
// extension members with With.
var (
	// ErrOrderNotFound: no order with that id for the tenant (also another
	// tenant's order, so ids cannot be probed across tenants).
	ErrOrderNotFound = problem.New(problem.CodeNotFound, "No such order.")
	// ErrOutOfStock: at least one item is short; a stored outcome, no
	// order, no charge.
	ErrOutOfStock = problem.New(problem.CodeOutOfStock,
		"At least one item is not available in the requested quantity. No order was created and nothing was charged.")
	// errCardDeclined: a stored outcome, the order payment_failed (with
	// order_id and decline_code: cardDeclined).
	errCardDeclined = problem.New(problem.CodeCardDeclined,
		"The payment was declined. The order is payment_failed and its stock was released.")
	// errPaymentRejected: a stored outcome, the order payment_failed (with
	// order_id: paymentRejected).
	errPaymentRejected = problem.New(problem.CodePaymentRejected,
		"The payment provider refused the payment request (for example an unknown payment method). The order is payment_failed and its stock was released; retrying cannot succeed.")
	// errPaymentUnavailable: not stored, the key keeps its recovery point.
	errPaymentUnavailable = problem.New(problem.CodePaymentProviderUnavailable,
		"The payment provider did not answer, or its answer is not known yet. Retry with the same Idempotency-Key: it resumes this request where it stopped and never charges twice.")
	// errProviderCredentials is answered as payment_provider_unavailable
	// (with its own status): Stripe refused our own credentials (401,
	// 403); not stored, the key keeps its recovery point and the order its
	// stock.
	errProviderCredentials = problem.New(problem.CodePaymentProviderCredentials,
		"The payment provider refused this service's credentials, so this payment is not settled yet; the order keeps its stock. Retry with the same Idempotency-Key once the service is fixed: it resumes this request and never charges twice.")
	// errUnavailable: not stored, the key keeps its recovery point.
	errUnavailable = problem.New(problem.CodeUnavailable,
		"A dependency is unavailable. Retry with the same Idempotency-Key: it resumes this request where it stopped and never charges twice.")
)

// unavailable is a transient failure of a dependency (the database, a
// deadline): the key keeps its recovery point.
func unavailable(cause error) error { return problem.Wrap(errUnavailable, cause) }

// providerCredentials is a payment of order orderID that could not reach
// Stripe because Stripe refused our own credentials:
// payment_provider_unavailable, with the status and Retry-After of
// problem.CodePaymentProviderCredentials.
func providerCredentials(orderID string, cause error) error {
	return problem.Wrap(errProviderCredentials, fmt.Errorf("order %s: %w", orderID, cause))
}

// paymentUnavailable is a payment of order orderID whose outcome is not
// known yet (Stripe unanswered, indeterminate and not reconcilable yet, or
// money still moving): the key keeps its recovery point. retryAfter, when
// positive, replaces the code's Retry-After (seconds): when the saga knows
// that no retry can get further before then.
func paymentUnavailable(orderID string, cause error, retryAfter int) error {
	e := errPaymentUnavailable
	if retryAfter > 0 {
		e = e.WithRetryAfter(retryAfter)
	}
	return problem.Wrap(e, fmt.Errorf("order %s: %w", orderID, cause))
}

// cardDeclined is the stored 402 of order orderID whose card was declined,
// with Stripe's decline code when there is one.
func cardDeclined(orderID, declineCode string) *problem.Error {
	e := errCardDeclined.With("order_id", orderID)
	if declineCode != "" {
		e = e.With("decline_code", declineCode)
	}
	return e
}

// paymentRejected is the stored 402 of order orderID whose payment Stripe
// refused, canceled or let time out; detail, when not empty, replaces the
// code's.
func paymentRejected(orderID, detail string) *problem.Error {
	e := errPaymentRejected.With("order_id", orderID)
	if detail != "" {
		e.Detail = detail // With copied it
	}
	return e
}

// notCancelableError is the stored 409 order_not_cancelable saying detail.
func notCancelableError(detail string) *problem.Error {
	return problem.New(problem.CodeOrderNotCancelable, detail)
}
