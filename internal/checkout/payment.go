package checkout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// PaymentProvider is what the checkout needs of a payment service provider:
// one call that creates and confirms a PaymentIntent.
//
// Implementations must be idempotent on ChargeRequest.IdempotencyKey: a second
// call with the same key and parameters returns the first call's result and
// never charges again (https://stripe.com/docs/api/idempotent_requests).
//
// A card decline is an outcome, not an error: it returns a ChargeResult with
// Declined set and a nil error. A non-nil error means the outcome is unknown or
// transient (5xx, timeout, 409 idempotency_key_in_use, network failure): the
// checkout keeps its recovery point and a retry calls again with the same key.
type PaymentProvider interface {
	Charge(ctx context.Context, req ChargeRequest) (ChargeResult, error)
}

// ChargeRequest describes one PaymentIntent to create with confirm=true.
type ChargeRequest struct {
	// IdempotencyKey is sent as Stripe's Idempotency-Key header; see StepKey.
	IdempotencyKey string
	// Amount is in the currency's minor unit (cents for usd).
	Amount int64
	// Currency is a lowercase ISO 4217 code, e.g. "usd".
	Currency string
	// PaymentMethod is a Stripe PaymentMethod id or test token, e.g. "pm_card_visa".
	PaymentMethod string
	// OrderID and TenantID go into the PaymentIntent's metadata.
	OrderID  string
	TenantID string
}

// ChargeResult is the final state of a confirmed PaymentIntent.
type ChargeResult struct {
	// PaymentIntentID is Stripe's id, "pi_…". Set on success and on decline.
	PaymentIntentID string
	// Status is the PaymentIntent status, e.g. "succeeded" or
	// "requires_payment_method" after a decline.
	Status string
	// Declined is true when Stripe answered with a card_error.
	Declined bool
	// DeclineCode is Stripe's decline_code or error code, e.g. "card_declined".
	DeclineCode string
}

// StepKey returns the deterministic idempotency key for one Stripe step of one
// checkout: hex(sha256(tenant ":" idempotency key ":" order id ":" step)).
//
// The same checkout always sends the same key for the same step, so a resumed
// or completed request can never charge twice. The order id is part of it
// because a client key may be used again after IDEMPOTENCY_TTL for a new
// request, which must not replay the old PaymentIntent.
func StepKey(tenantID, idempotencyKey, orderID, step string) string {
	sum := sha256.Sum256([]byte(tenantID + ":" + idempotencyKey + ":" + orderID + ":" + step))
	return hex.EncodeToString(sum[:])
}

// StepPaymentIntent names the create-and-confirm PaymentIntent step.
const StepPaymentIntent = "payment_intent"
