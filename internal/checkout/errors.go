package checkout

import "errors"

// Error codes of the checkout domain. Each is the "code" member of the
// problem the API answers with; http.go maps each to its HTTP status, in one
// place (problemFor).
const (
	CodeValidation         = "validation_error"             // 400: the request is invalid; not stored
	CodeNotFound           = "not_found"                    // 404: no such order for the tenant
	CodeOutOfStock         = "out_of_stock"                 // 409: stored outcome, no order
	CodeNotCancelable      = "order_not_cancelable"         // 409: stored outcome of a cancel
	CodeCardDeclined       = "card_declined"                // 402: stored outcome, order payment_failed
	CodePaymentRejected    = "payment_rejected"             // 402: stored outcome, order payment_failed
	CodePaymentUnavailable = "payment_provider_unavailable" // 502: not stored, the key keeps its recovery point
	CodeUnavailable        = "unavailable"                  // 503: not stored, the key keeps its recovery point
	// codeProviderCredentials is answered as payment_provider_unavailable
	// with 503: Stripe refused our own credentials (401, 403); not stored,
	// the key keeps its recovery point and the order its stock.
	codeProviderCredentials = "payment_provider_credentials"
)

// Error is a domain error with a code (Code* constants). It carries no HTTP
// status: http.go decides it.
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
// deadline): 503, the key keeps its recovery point.
func unavailable(cause error) error { return &Error{Code: CodeUnavailable, Cause: cause} }

// providerCredentials is a payment that could not reach Stripe because
// Stripe refused our own credentials: 503 payment_provider_unavailable.
func providerCredentials(orderID string, cause error) *Error {
	return &Error{Code: codeProviderCredentials, OrderID: orderID, Cause: cause}
}

// paymentUnavailable is a payment whose outcome is not known yet (Stripe
// unanswered, indeterminate and not reconcilable yet, or money still
// moving): 502, the key keeps its recovery point.
func paymentUnavailable(orderID string, cause error) *Error {
	return &Error{Code: CodePaymentUnavailable, OrderID: orderID, Cause: cause}
}
