package checkout

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/stripestep"
)

// PaymentProvider is what the checkout needs of a payment service provider:
// Stripe's PaymentIntents API as separate steps
// (https://docs.stripe.com/api/payment_intents). *payments.Client
// implements it.
//
// Every write (create, confirm, cancel) carries the caller's idempotency
// key, derived from persisted state (stripestep.Key), and implementations retry
// only the failures Stripe did not store under that key (network errors,
// timeouts, 409 idempotency_key_in_use, 429, 503), always with the same key
// and parameters. Errors:
//   - a *PaymentRefusal: Stripe answered with a final refusal: a card error
//     (402, Declined set) or another 4xx (rejected). Never retried.
//   - stripestep.ErrIndeterminate (wrapped): Stripe answered 500 (or another
//     error it stores under the key): the request may or may not have been
//     executed, and may be rolled forward later; resending the key replays
//     the same error, so the caller must reconcile (RetrievePaymentIntent,
//     SearchPaymentIntents) before any new attempt
//     (https://docs.stripe.com/api/idempotent_requests, "including 500
//     errors"; https://docs.stripe.com/error-low-level).
//   - stripestep.ErrUnanswered (wrapped): no final answer within the retry
//     budget; the request may have been executed. Resending the same key is
//     safe while Stripe keeps it (24 hours).
//   - stripestep.ErrCredentials (wrapped): Stripe refused our own credentials
//     (401, 403) before executing anything, so nothing is stored under the
//     key and the same request may be sent again once the key is fixed. It
//     says nothing about the customer's payment. Never retried.
type PaymentProvider interface {
	// CreatePaymentIntent creates an unconfirmed PaymentIntent (confirm=false):
	// it moves no money.
	CreatePaymentIntent(ctx context.Context, req CreateIntentRequest) (PaymentIntentState, error)
	// ConfirmPaymentIntent confirms the PaymentIntent with its payment
	// method: this is the step that moves money.
	ConfirmPaymentIntent(ctx context.Context, req ConfirmIntentRequest) (PaymentIntentState, error)
	// CancelPaymentIntent cancels an unconfirmed PaymentIntent (or one
	// waiting for the customer's action).
	CancelPaymentIntent(ctx context.Context, req CancelIntentRequest) (PaymentIntentState, error)
	// RetrievePaymentIntent reads a PaymentIntent by id, strongly
	// consistent. An unknown id is a *PaymentRefusal (404 resource_missing).
	RetrievePaymentIntent(ctx context.Context, id string) (PaymentIntentState, error)
	// SearchPaymentIntents returns the PaymentIntents whose
	// metadata['order_id'] is orderID. Search is eventually consistent: an
	// object appears in it about a minute after it was created.
	SearchPaymentIntents(ctx context.Context, orderID string) ([]PaymentIntentState, error)
}

// CreateIntentRequest is POST /v1/payment_intents with confirm=false.
type CreateIntentRequest struct {
	// IdempotencyKey is sent as Stripe's Idempotency-Key header (stripestep.Key).
	IdempotencyKey string `json:"-"`
	// Amount is in the currency's minor unit (cents for usd).
	Amount int64 `json:"amount"`
	// Currency is a lowercase ISO 4217 code, e.g. "usd".
	Currency string `json:"currency"`
	// PaymentMethod is a Stripe PaymentMethod id or test id, e.g. "pm_card_visa".
	PaymentMethod string `json:"payment_method"`
	// OrderID and TenantID go into metadata[order_id] and metadata[tenant_id].
	OrderID  string `json:"order_id"`
	TenantID string `json:"tenant_id"`
}

// ConfirmIntentRequest is POST /v1/payment_intents/{id}/confirm.
type ConfirmIntentRequest struct {
	IdempotencyKey  string `json:"-"`
	PaymentIntentID string `json:"payment_intent"`
	// ReturnURL, when set, is sent as return_url: a 3D Secure card then
	// answers with next_action redirect_to_url instead of use_stripe_sdk
	// (https://docs.stripe.com/api/payment_intents/confirm#confirm_payment_intent-return_url).
	ReturnURL string `json:"return_url,omitempty"`
}

// CancelIntentRequest is POST /v1/payment_intents/{id}/cancel.
type CancelIntentRequest struct {
	IdempotencyKey  string `json:"-"`
	PaymentIntentID string `json:"payment_intent"`
	// Reason is Stripe's cancellation_reason: "duplicate" (an orphan of an
	// indeterminate create), "requested_by_customer" (POST
	// /v1/orders/{id}/cancel) or "abandoned" (any other close of the
	// order's payment: PAYMENT_ACTION_TIMEOUT, a decline, a rejection;
	// Cause says which).
	Reason string `json:"cancellation_reason"`
	// Cause is why this service closes the order's payment: the failure
	// code the order leaves the way to paid with (CodePaymentRejected,
	// CodeCardDeclined, FailureActionTimeout, FailureCanceled), "" for an
	// orphan. It is kept with the request in the step log and never sent:
	// Stripe's four cancellation reasons cannot say it, and whoever applies
	// the canceled PaymentIntent first (the cancel's own webhook may
	// overtake the request that sent it) must fail the order for the same
	// reason (cancelCause).
	Cause string `json:"cause,omitempty"`
}

// Cancellation reasons (https://docs.stripe.com/api/payment_intents/cancel).
const (
	CancelDuplicate           = "duplicate"
	CancelRequestedByCustomer = "requested_by_customer"
	CancelAbandoned           = "abandoned"
)

// PaymentIntentState is Stripe's state of one PaymentIntent, as far as the
// checkout uses it (https://docs.stripe.com/api/payment_intents/object).
type PaymentIntentState struct {
	// ID is "pi_…".
	ID string
	// Status is Stripe's status of it.
	Status stripeintent.Status
	// Amount is in the currency's minor unit; Currency lowercase ISO 4217.
	Amount   int64
	Currency string
	// Metadata holds order_id and tenant_id for the PaymentIntents the
	// checkout creates.
	Metadata map[string]string
	// NextAction is Stripe's next_action object as it sent it (JSON), set
	// while Status is requires_action.
	NextAction json.RawMessage
	// ClientSecret lets the customer's browser complete the next action.
	ClientSecret string
	// LastErrorCode and LastDeclineCode are last_payment_error's code and
	// decline_code, e.g. "card_declined" / "generic_decline", or
	// "payment_intent_authentication_failure" after a failed 3D Secure.
	LastErrorCode, LastDeclineCode string
	// CancellationReason is set when Status is canceled.
	CancellationReason string
	// Created is the creation time in Unix seconds.
	Created int64
}

// PaymentRefusal is Stripe's final refusal of one request
// (https://docs.stripe.com/api/errors): a card error, or another 4xx.
type PaymentRefusal struct {
	// Declined is true for a card_error (HTTP 402): the card was declined.
	Declined bool
	// HTTPStatus is Stripe's status code, e.g. 402, 400, 404.
	HTTPStatus int
	// Type, Code, DeclineCode, Param and Message are Stripe's error fields,
	// e.g. "invalid_request_error", "resource_missing", "", "payment_method".
	Type, Code, DeclineCode, Param, Message string
	// PaymentIntent is the PaymentIntent a card error names, if any.
	PaymentIntent *PaymentIntentState
}

// Error returns e.g. "stripe 400 invalid_request_error/resource_missing: No such PaymentMethod".
func (e *PaymentRefusal) Error() string {
	kind := e.Type
	if e.Code != "" {
		kind += "/" + e.Code
	}
	return fmt.Sprintf("stripe %d %s: %s", e.HTTPStatus, kind, e.Message)
}

// StepOutcome is the outcome the step log records for the refusal
// (stripestep.Refusal): Failed for a decline, Rejected otherwise.
func (e *PaymentRefusal) StepOutcome() stripestep.Outcome {
	if e.Declined {
		return stripestep.Failed
	}
	return stripestep.Rejected
}
