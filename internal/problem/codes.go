package problem

import "net/http"

// Code is the "code" member of a problem: the stable, machine-readable name
// clients switch on (docs/CONTRACT.md). Each Code has one row in the table
// below giving its HTTP status, title and default Retry-After; domain
// packages name a Code and never a status.
type Code string

// The codes of the contract, and the few the service adds (see table).
const (
	// CodeUnauthorized: a missing or unknown API key (401).
	CodeUnauthorized Code = "unauthorized"
	// CodeRateLimited: the tenant's rate limit is exceeded (429, with
	// Retry-After); never stored.
	CodeRateLimited Code = "rate_limited"
	// CodeUnsupportedMediaType: a body that is not one uncompressed UTF-8
	// application/json (415).
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	// CodePayloadTooLarge: a body over the route's limit (413).
	CodePayloadTooLarge Code = "payload_too_large"
	// CodeIdempotencyKeyMissing: no Idempotency-Key (400).
	CodeIdempotencyKeyMissing Code = "idempotency_key_missing"
	// CodeIdempotencyKeyInvalid: a malformed or repeated Idempotency-Key
	// (400).
	CodeIdempotencyKeyInvalid Code = "idempotency_key_invalid"
	// CodeMalformedJSON: a body that is not JSON, or not whole (400).
	CodeMalformedJSON Code = "malformed_json"
	// CodeIdempotencyKeyReused: the key was used with another request (422).
	CodeIdempotencyKeyReused Code = "idempotency_key_reused"
	// CodeIdempotencyKeyInUse: the key's request is still executing, or
	// another owner took it over (409, Retry-After: 1).
	CodeIdempotencyKeyInUse Code = "idempotency_key_in_use"
	// CodeValidation: invalid fields, listed in the "errors" member (400);
	// never stored.
	CodeValidation Code = "validation_error"
	// CodeNotFound: no such order for the tenant, or no such route (404).
	CodeNotFound Code = "not_found"
	// CodeOutOfStock: an item is short; a stored outcome, no order (409).
	CodeOutOfStock Code = "out_of_stock"
	// CodeOrderNotCancelable: the order is not in requires_action; a stored
	// outcome of a cancel (409).
	CodeOrderNotCancelable Code = "order_not_cancelable"
	// CodeCardDeclined: the card was declined; a stored outcome with
	// "order_id" (402).
	CodeCardDeclined Code = "card_declined"
	// CodePaymentRejected: Stripe refused the payment request; a stored
	// outcome with "order_id" (402).
	CodePaymentRejected Code = "payment_rejected"
	// CodeOrderNotRefundable: the order is neither paid nor
	// partially_refunded; a stored outcome of a refund (409).
	CodeOrderNotRefundable Code = "order_not_refundable"
	// CodeRefundExceedsPayment: more than what is left to refund; a stored
	// outcome of a refund (409).
	CodeRefundExceedsPayment Code = "refund_exceeds_payment"
	// CodePaymentProviderUnavailable: Stripe did not answer, or its answer
	// is not known yet (502, with Retry-After); not stored, the key keeps
	// its recovery point.
	CodePaymentProviderUnavailable Code = "payment_provider_unavailable"
	// CodePaymentProviderCredentials is answered as
	// payment_provider_unavailable with 503 (CONTRACT.md v3): Stripe refused
	// the service's own credentials (401, 403). Not stored; the key keeps
	// its recovery point and the order its stock. It is the one Code that is
	// not its own wire code.
	CodePaymentProviderCredentials Code = "payment_provider_credentials"
	// CodeUnavailable: a dependency (the database, Redis, a deadline)
	// failed (503, with Retry-After); not stored.
	CodeUnavailable Code = "unavailable"
	// CodeInvalidSignature: a webhook whose Stripe-Signature does not
	// verify (400).
	CodeInvalidSignature Code = "invalid_signature"
	// CodeMalformedEvent: a webhook body that is signed but is not a Stripe
	// event, or could not be read (400).
	CodeMalformedEvent Code = "malformed_event"
	// CodeMethodNotAllowed: the route exists but not for this method (405).
	CodeMethodNotAllowed Code = "method_not_allowed"
	// CodeHeadersTooLarge: the request line and headers exceed the server's
	// limit (431).
	CodeHeadersTooLarge Code = "headers_too_large"
	// CodeInternal: anything unexpected (500); the error is logged, never
	// shown.
	CodeInternal Code = "internal"
)

// row is how one Code is answered.
type row struct {
	// Status is the HTTP status code.
	Status int
	// Title is the problem's "title": the same for every occurrence.
	Title string
	// RetryAfter, when positive, is the default Retry-After header in
	// seconds; an Error may give its own.
	RetryAfter int
	// As, when set, is the code the client sees instead of the row's own
	// (the same code answered with another status).
	As Code
}

// table is the one place where a code becomes an HTTP status, a title and a
// Retry-After. TestTable holds it to the codes docs/CONTRACT.md names.
var table = map[Code]row{
	CodeUnauthorized:          {Status: http.StatusUnauthorized, Title: "Unauthorized"},
	CodeRateLimited:           {Status: http.StatusTooManyRequests, Title: "Too many requests", RetryAfter: 1},
	CodeUnsupportedMediaType:  {Status: http.StatusUnsupportedMediaType, Title: "Unsupported media type"},
	CodePayloadTooLarge:       {Status: http.StatusRequestEntityTooLarge, Title: "Payload too large"},
	CodeIdempotencyKeyMissing: {Status: http.StatusBadRequest, Title: "Idempotency-Key missing"},
	CodeIdempotencyKeyInvalid: {Status: http.StatusBadRequest, Title: "Idempotency-Key invalid"},
	CodeMalformedJSON:         {Status: http.StatusBadRequest, Title: "Malformed JSON"},
	CodeIdempotencyKeyReused:  {Status: http.StatusUnprocessableEntity, Title: "Idempotency-Key reused"},
	CodeIdempotencyKeyInUse:   {Status: http.StatusConflict, Title: "Idempotency-Key in use", RetryAfter: 1},
	CodeValidation:            {Status: http.StatusBadRequest, Title: "Validation failed"},
	CodeNotFound:              {Status: http.StatusNotFound, Title: "Not found"},
	CodeOutOfStock:            {Status: http.StatusConflict, Title: "Out of stock"},
	CodeOrderNotCancelable:    {Status: http.StatusConflict, Title: "Order not cancelable"},
	CodeCardDeclined:          {Status: http.StatusPaymentRequired, Title: "Card declined"},
	CodePaymentRejected:       {Status: http.StatusPaymentRequired, Title: "Payment rejected"},
	CodeOrderNotRefundable:    {Status: http.StatusConflict, Title: "Order not refundable"},
	CodeRefundExceedsPayment:  {Status: http.StatusConflict, Title: "Refund exceeds payment"},
	CodePaymentProviderUnavailable: {Status: http.StatusBadGateway, Title: "Payment provider unavailable",
		RetryAfter: 2},
	// Credentials take a person to fix: no retry gets further sooner.
	CodePaymentProviderCredentials: {Status: http.StatusServiceUnavailable, Title: "Payment provider unavailable",
		RetryAfter: 30, As: CodePaymentProviderUnavailable},
	CodeUnavailable:      {Status: http.StatusServiceUnavailable, Title: "Service unavailable", RetryAfter: 1},
	CodeInvalidSignature: {Status: http.StatusBadRequest, Title: "Invalid signature"},
	CodeMalformedEvent:   {Status: http.StatusBadRequest, Title: "Malformed event"},
	CodeMethodNotAllowed: {Status: http.StatusMethodNotAllowed, Title: "Method not allowed"},
	CodeHeadersTooLarge:  {Status: http.StatusRequestHeaderFieldsTooLarge, Title: "Request headers too large"},
	CodeInternal:         {Status: http.StatusInternalServerError, Title: "Internal server error"},
}

// wire returns the code the client sees for a row.
func (s row) wire(code Code) Code {
	if s.As != "" {
		return s.As
	}
	return code
}
