package client

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Code is a problem's machine-readable code (the "code" member of the
// service's RFC 9457 problem details).
type Code string

// The codes of schema Problem.code. Only CodeIdempotencyKeyInUse and
// CodeRateLimited (besides 502, 503 and 504, whatever their code) are
// retried; every other one is final for its key and body.
const (
	CodeUnauthorized               Code = "unauthorized"
	CodeUnsupportedMediaType       Code = "unsupported_media_type"
	CodePayloadTooLarge            Code = "payload_too_large"
	CodeIdempotencyKeyMissing      Code = "idempotency_key_missing"
	CodeIdempotencyKeyInvalid      Code = "idempotency_key_invalid"
	CodeMalformedJSON              Code = "malformed_json"
	CodeIdempotencyKeyReused       Code = "idempotency_key_reused"
	CodeIdempotencyKeyInUse        Code = "idempotency_key_in_use"
	CodeValidationError            Code = "validation_error"
	CodeCardDeclined               Code = "card_declined"
	CodePaymentRejected            Code = "payment_rejected"
	CodeOutOfStock                 Code = "out_of_stock"
	CodeOrderNotCancelable         Code = "order_not_cancelable"
	CodePaymentProviderUnavailable Code = "payment_provider_unavailable"
	CodeInvalidSignature           Code = "invalid_signature"
	CodeMalformedEvent             Code = "malformed_event"
	CodeUnavailable                Code = "unavailable"
	CodeNotFound                   Code = "not_found"
	CodeMethodNotAllowed           Code = "method_not_allowed"
	CodeInternal                   Code = "internal"
	CodeOrderNotRefundable         Code = "order_not_refundable"
	CodeRefundExceedsPayment       Code = "refund_exceeds_payment"
	CodeRateLimited                Code = "rate_limited"
	CodeHeadersTooLarge            Code = "headers_too_large"
)

// Problem is an RFC 9457 problem details object as the service sends it
// (schema Problem), with the extension members it uses.
type Problem struct {
	// Type is a URI naming the problem type.
	Type string `json:"type"`
	// Title is a short human-readable summary.
	Title string `json:"title"`
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence.
	Detail string `json:"detail,omitempty"`
	// Code is the machine-readable code.
	Code Code `json:"code"`
	// Errors are the invalid fields of a validation_error.
	Errors []FieldError `json:"errors,omitempty"`
	// OrderID is the order of a 402 (card_declined, payment_rejected) or a
	// 409 about a refund.
	OrderID string `json:"order_id,omitempty"`
	// DeclineCode is Stripe's decline_code of a card_declined, if any.
	DeclineCode string `json:"decline_code,omitempty"`
	// AmountRefundable is what is left to refund, in minor units, in a
	// refund_exceeds_payment.
	AmountRefundable *int64 `json:"amount_refundable,omitempty"`
}

// FieldError is one invalid field of a validation_error.
type FieldError struct {
	// Field is the JSON path of the field, e.g. "items[0].quantity".
	Field string `json:"field"`
	// Message says what is wrong with it.
	Message string `json:"message"`
}

// Call says how an operation's answer was obtained. Results embed it, and
// so does *Error.
type Call struct {
	// IdempotencyKey is the key every attempt carried, the caller's or the
	// one the client made; "" for reads. Send it again to resume or
	// replay the same operation.
	IdempotencyKey string
	// Attempts is how many HTTP requests were sent (1 when the first
	// answer was final). net/http may also resend a request itself, on a
	// kept-alive connection the server closed before answering (it treats
	// a request with an Idempotency-Key as replayable): that resend is
	// inside one attempt, and as safe, the key being the same.
	Attempts int
	// Replayed reports Idempotent-Replayed: true on the final answer: the
	// service replayed the answer stored under the key by an earlier
	// request (of this call or another), and executed nothing new.
	Replayed bool
	// StatusCode is the final answer's HTTP status, 0 when there was none
	// (a transport error).
	StatusCode int
	// Location is the final answer's Location header, e.g.
	// "/v1/orders/ord_…" on a 201 or 202 checkout.
	Location string
	// RequestID is the final answer's X-Request-Id: the id under which the
	// service logged the request (it echoes one the caller sent, or makes
	// one). Quote it when asking the operator about a call; "" when no
	// answer came.
	RequestID string
}

// Error is a call that did not succeed: a final error answer, or the last
// transient answer (or transport error) when retrying stopped. Use
// errors.As to get it.
type Error struct {
	// Problem is the answer's problem details; for an answer that was not
	// problem+json (a gateway's 504 page) only Status is set, and Body
	// holds what came.
	Problem
	// RetryAfter is the answer's Retry-After (RFC 9110 section 10.2.3) as
	// a duration, 0 when absent.
	RetryAfter time.Duration
	// Body is the answer's body, as received.
	Body []byte
	// Call is how the answer was obtained; Call.StatusCode is 0 when no
	// answer came at all.
	Call
	// Transport is the error of the last attempt when it got no answer
	// (a refused, reset or cut connection, an attempt timeout).
	Transport error
	// Stopped is why retrying stopped before a final answer: the
	// context's error (or context.DeadlineExceeded when the next wait
	// would have passed the context's deadline) or ErrTooManyAttempts. It
	// is nil when the answer was final.
	Stopped error
}

// ErrTooManyAttempts is Error.Stopped when RetryPolicy.MaxAttempts
// attempts all got transient answers.
var ErrTooManyAttempts = errors.New("client: too many attempts")

// The sentinel errors, one per family of problem codes, for errors.Is: an
// *Error is each one its code (or, for an answer without a problem body,
// its status) belongs to, as families maps them. errors.As gives the
// *Error itself, with the code, the order and the request id.
var (
	// ErrPaymentDeclined: 402 card_declined or payment_rejected. Final for
	// the key: the order (Error.OrderID) is payment_failed, nothing was
	// charged; a new purchase needs a new key.
	ErrPaymentDeclined = errors.New("client: payment declined")
	// ErrOutOfStock: 409 out_of_stock. Final for the key.
	ErrOutOfStock = errors.New("client: out of stock")
	// ErrKeyReused: 422 idempotency_key_reused, the key was used for
	// another request (another body or route). Final: a caller bug.
	ErrKeyReused = errors.New("client: idempotency key reused for another request")
	// ErrKeyInUse: 409 idempotency_key_in_use, the key's first request
	// still runs. Transient: the client retries it; seen only when
	// retrying stopped.
	ErrKeyInUse = errors.New("client: idempotency key in use")
	// ErrInvalidRequest: 400 validation_error (Error.Errors),
	// malformed_json, idempotency_key_missing or _invalid, 405, 413, 415,
	// 431. Final: the request must change.
	ErrInvalidRequest = errors.New("client: invalid request")
	// ErrUnauthorized: 401 unauthorized, an unknown API key.
	ErrUnauthorized = errors.New("client: unauthorized")
	// ErrNotFound: 404 not_found, an unknown order or another tenant's.
	ErrNotFound = errors.New("client: not found")
	// ErrOrderState: 409 order_not_cancelable, order_not_refundable or
	// refund_exceeds_payment: the order's status (or what is left of its
	// payment, Error.AmountRefundable) does not allow the command. Final
	// for the key; GetOrder shows the order.
	ErrOrderState = errors.New("client: the order's state does not allow it")
	// ErrUnavailable: 429 rate_limited, 503 unavailable or
	// payment_provider_unavailable, 502, 504, or no answer at all.
	// Transient: the operation is still open; call again later with
	// Error.IdempotencyKey.
	ErrUnavailable = errors.New("client: service unavailable")
	// ErrInternal: 500 internal, the service's unknown error (logged there
	// under Error.RequestID).
	ErrInternal = errors.New("client: internal error")
)

// families maps each problem code to its sentinel: the one place a code
// gets its family.
var families = map[Code]error{
	CodeCardDeclined:               ErrPaymentDeclined,
	CodePaymentRejected:            ErrPaymentDeclined,
	CodeOutOfStock:                 ErrOutOfStock,
	CodeIdempotencyKeyReused:       ErrKeyReused,
	CodeIdempotencyKeyInUse:        ErrKeyInUse,
	CodeValidationError:            ErrInvalidRequest,
	CodeMalformedJSON:              ErrInvalidRequest,
	CodeIdempotencyKeyMissing:      ErrInvalidRequest,
	CodeIdempotencyKeyInvalid:      ErrInvalidRequest,
	CodeUnsupportedMediaType:       ErrInvalidRequest,
	CodePayloadTooLarge:            ErrInvalidRequest,
	CodeHeadersTooLarge:            ErrInvalidRequest,
	CodeMethodNotAllowed:           ErrInvalidRequest,
	CodeUnauthorized:               ErrUnauthorized,
	CodeNotFound:                   ErrNotFound,
	CodeOrderNotCancelable:         ErrOrderState,
	CodeOrderNotRefundable:         ErrOrderState,
	CodeRefundExceedsPayment:       ErrOrderState,
	CodeRateLimited:                ErrUnavailable,
	CodeUnavailable:                ErrUnavailable,
	CodePaymentProviderUnavailable: ErrUnavailable,
	CodeInternal:                   ErrInternal,
	// invalid_signature and malformed_event answer Stripe's webhook
	// deliveries, which this client does not send.
}

// family is the sentinel of e: its code's, or for an answer without a
// known code (a gateway's page, no answer) its status's.
func (e *Error) family() error {
	if f, ok := families[e.Code]; ok {
		return f
	}
	switch {
	case e.StatusCode == 0 && e.Transport != nil, transient(e.StatusCode, ""):
		return ErrUnavailable
	case e.StatusCode >= 500:
		return ErrInternal
	}
	return nil
}

// Is reports whether target is e's sentinel (ErrPaymentDeclined, …), so
// errors.Is(err, client.ErrOutOfStock) needs no errors.As.
func (e *Error) Is(target error) bool {
	f := e.family()
	return f != nil && f == target
}

// Error describes the answer, its code and the attempts.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("checkout api: ")
	switch {
	case e.StatusCode == 0 && e.Transport != nil:
		fmt.Fprintf(&b, "no answer: %v", e.Transport)
	case e.Code != "":
		fmt.Fprintf(&b, "%d %s", e.StatusCode, e.Code)
		if e.Detail != "" {
			fmt.Fprintf(&b, ": %s", e.Detail)
		}
	default:
		fmt.Fprintf(&b, "%d", e.StatusCode)
	}
	fmt.Fprintf(&b, " (after %d attempt", e.Attempts)
	if e.Attempts != 1 {
		b.WriteString("s")
	}
	if e.RequestID != "" {
		fmt.Fprintf(&b, "; request %s", e.RequestID)
	}
	if e.Stopped != nil {
		fmt.Fprintf(&b, "; stopped: %v", e.Stopped)
	}
	b.WriteString(")")
	return b.String()
}

// Unwrap returns Stopped and Transport, so errors.Is(err,
// context.DeadlineExceeded) tells a call that ran out of time.
func (e *Error) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Stopped, e.Transport} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Temporary reports whether the answer was transient (see the package
// doc): the operation may still succeed when sent again later with the
// same key (Call.IdempotencyKey) and body.
func (e *Error) Temporary() bool { return transient(e.StatusCode, e.Code) }

// IsCode reports whether err is an *Error with code c.
func IsCode(err error, c Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == c
}
