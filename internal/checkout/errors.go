package checkout

import (
	"errors"

	"github.com/onceonly/checkout/internal/problem"
)

// Error codes of the checkout domain: the problem codes (internal/problem,
// whose table gives each its HTTP status, title and Retry-After) as the
// strings the domain stores, e.g. as an order's failure code.
const (
	CodeValidation         = string(problem.CodeValidation)                 // the request is invalid; not stored
	CodeNotFound           = string(problem.CodeNotFound)                   // no such order for the tenant
	CodeOutOfStock         = string(problem.CodeOutOfStock)                 // stored outcome, no order
	CodeNotCancelable      = string(problem.CodeOrderNotCancelable)         // stored outcome of a cancel
	CodeCardDeclined       = string(problem.CodeCardDeclined)               // stored outcome, order payment_failed
	CodePaymentRejected    = string(problem.CodePaymentRejected)            // stored outcome, order payment_failed
	CodePaymentUnavailable = string(problem.CodePaymentProviderUnavailable) // not stored, the key keeps its recovery point
	CodeUnavailable        = string(problem.CodeUnavailable)                // not stored, the key keeps its recovery point
	// codeProviderCredentials is answered as payment_provider_unavailable
	// (with its own status): Stripe refused our own credentials (401, 403);
	// not stored, the key keeps its recovery point and the order its stock.
	codeProviderCredentials = string(problem.CodePaymentProviderCredentials)
)

// Failure codes: why an order left the way to paid (orders.Order.FailureCode,
// from which responseFor answers its checkout key): CodeCardDeclined,
// CodePaymentRejected, or one of these.
const (
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

// Error is a domain error with a code (Code* constants). It carries no HTTP
// status: http.go turns it into a coded problem.Error, whose table decides
// it.
type Error struct {
	// Code is one of the Code* constants.
	Code string
	// Detail is a sentence for people; empty takes the code's default.
	Detail string
	// Fields lists the invalid fields of a validation_error.
	Fields []FieldError
	// OrderID names the order an outcome concerns (card_declined,
	// payment_rejected).
	OrderID string
	// DeclineCode is Stripe's decline_code of a card_declined.
	DeclineCode string
	// RetryAfter, when positive, replaces the code's Retry-After (seconds):
	// when the saga knows that no retry can get further before then.
	RetryAfter int
	// Cause is the underlying error, for logs; never shown to clients.
	Cause error
}

// Error returns "code: detail" and the cause.
func (e *Error) Error() string {
	s := e.Code
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// ErrorCode returns the code of the *Error err is or wraps, or "".
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Errors without a cause.
var (
	// ErrOrderNotFound: no order with that id for the tenant (also another
	// tenant's order, so ids cannot be probed across tenants).
	ErrOrderNotFound = &Error{Code: CodeNotFound}
	// ErrOutOfStock: at least one item is short; no order, no charge.
	ErrOutOfStock = &Error{Code: CodeOutOfStock}
)

// unavailable is a transient failure of a dependency (the database, a
// deadline): the key keeps its recovery point.
func unavailable(cause error) error { return &Error{Code: CodeUnavailable, Cause: cause} }

// providerCredentials is a payment that could not reach Stripe because
// Stripe refused our own credentials: payment_provider_unavailable, with
// the status and Retry-After of codeProviderCredentials.
func providerCredentials(orderID string, cause error) *Error {
	return &Error{Code: codeProviderCredentials, OrderID: orderID, Cause: cause}
}

// paymentUnavailable is a payment whose outcome is not known yet (Stripe
// unanswered, indeterminate and not reconcilable yet, or money still
// moving): the key keeps its recovery point.
func paymentUnavailable(orderID string, cause error) *Error {
	return &Error{Code: CodePaymentUnavailable, OrderID: orderID, Cause: cause}
}
