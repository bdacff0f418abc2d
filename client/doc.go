// Package client is the Go client of the checkout API (api/openapi.yaml,
// CONTRACT.md): checkouts, orders, cancellations, refunds and products, with
// the retry policy that makes a payment API safe to call over an unreliable
// network.
//
// # One key per logical operation
//
// Every write (CreateCheckout, CancelOrder, CreateRefund) takes an
// Idempotency-Key (draft-ietf-httpapi-idempotency-key-header). The caller
// makes one per logical operation (a purchase, a cancellation, a refund) and
// passes it, or passes "" and the client makes one (NewKey); either way the
// same key and the same body bytes are sent on every retry of that
// operation, and the key is returned in Call.IdempotencyKey and
// Error.IdempotencyKey so that a caller whose deadline ran out can try the
// same operation again later without paying twice. A key made per attempt
// would turn a lost answer into a second order and a second charge.
//
// # How long a key is kept
//
// The service keeps a key's final answer (a 2xx, a 402, or a 409 other than
// idempotency_key_in_use) and replays it for its
// IDEMPOTENCY_TTL (default 24 hours) counted from that final answer, however
// long the operation took to get one: a Stripe outage, a rotated Stripe key
// or a refund parked for REFUND_RETRY_AFTER only delay the start of that
// window. After it the key may be used as new, so a caller must not retry
// an operation that has had its final answer more than IDEMPOTENCY_TTL ago.
// A key that has had no final answer (only transient answers) never
// expires: calling again with it, however much later, resumes the
// operation and never starts a second one (CONTRACT.md, Retention).
//
// # What is retried
//
// Exactly the transient answers, which the service stores under no key:
// transport errors (no answer, or an answer cut short), 409
// idempotency_key_in_use (the first request still runs), 429 rate_limited,
// 502, 503 and 504 (a gateway gave up; the service goes on with the work
// and a retry replays it). Every other answer is final and is returned at
// once: 2xx, 402, 409 with another code, 422 idempotency_key_reused, any
// other 4xx, and 500 (the service's unknown error, which a retry is not
// known to cure). See RetryPolicy for the backoff, Retry-After (RFC 9110
// section 10.2.3) and the deadline.
//
// # Answers
//
// A success returns the decoded body with a Call: how many attempts it took
// and whether the answer was replayed (Idempotent-Replayed: true, the answer
// stored by an earlier attempt). A failure is an *Error carrying the RFC
// 9457 problem (code, status, detail, Retry-After), the same Call fields,
// and the transport or context error that ended the retries, if any.
//
// # Why the types are written, not generated
//
// The types follow api/openapi.yaml by hand rather than through a generator
// (oapi-codegen and the like): the spec uses allOf for the order view and
// the problem extensions, nullable enums and a free-form next_action, which
// generators turn into anonymous or pointer-heavy types, and a generator
// would be one more tool in the build. Written types carry doc comments,
// typed statuses and codes, and one Order for every route. TestTypesFollowOpenAPI
// keeps them in step: every property of every schema the client decodes or
// sends has a field with that JSON name, every enum value a constant, and a
// field the spec does not name fails the test unless it is listed there with
// the reason.
package client
