// Package refunds refunds paid orders through Stripe's Refund API
// (https://docs.stripe.com/api/refunds, https://docs.stripe.com/refunds):
// POST /v1/orders/{id}/refunds behind the idempotency gateway, the refund as
// a compensating step of the payment's saga log (payment_attempts, step
// "refund:{refund id}"), and "apply Stripe's state of refund X" for the
// webhook handler and the reconciler.
//
// The guarantees (CONTRACT.md v2, "Refunds"):
//   - An order's refunds never add up to more than it paid, whatever runs at
//     once: the pending refund is inserted in the transaction that locks the
//     order row and reserves its amount (orders.refund_reserved), and a CHECK
//     constraint refuses a reservation beyond amount_total.
//   - A refund is created at Stripe at most once: its row and its attempt
//     are committed before the call, the Stripe Idempotency-Key is derived
//     from them ("{order id}/refund:{refund id}/{attempt}"), and an
//     indeterminate answer (a 500 that Stripe stores under the key, a
//     timeout) is reconciled by listing the PaymentIntent's refunds and
//     matching metadata[refund_id]. It is never sent under a new key: one
//     still not found after RetryAfter is parked requires_attention (CONTRACT.md
//     v3), and reconciled until Stripe's refund appears.
//   - Statuses follow Stripe: pending until Stripe says succeeded or failed
//     (canceled counts as failed). A succeeded refund adds to the order's
//     amount_refunded, moves it to partially_refunded or refunded and emits
//     order.refunded (once); a failed one gives its amount back to what can
//     be refunded. Nothing moves backwards.
package refunds

import (
	"context"
	"time"

	"github.com/onceonly/checkout/internal/problem"
)

// Route is the idempotency scope's route of a refund. The order id is not
// part of the scope; the gateway adds the path's parameters to the
// fingerprint, so one key sent for two orders is 422
// idempotency_key_reused rather than a replay of the other order's refund.
const Route = "POST /v1/orders/{id}/refunds"

// RecoveryPointRefundCreated is stored with the key once the pending refund
// and its first attempt are committed: the Stripe step is next.
const RecoveryPointRefundCreated = "refund_created"

// Refund statuses (ours; Stripe's pending and requires_action are pending,
// its canceled is failed).
const (
	StatusPending   = "pending"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	// StatusRequiresAttention: the create stayed indeterminate for
	// RetryAfter and the refund is not found at Stripe. It is never sent
	// again under a new key (a refund cannot be canceled, so a late
	// roll-forward of the first attempt would refund twice); its amount
	// stays reserved, it is counted (checkout_refunds_requiring_attention)
	// and alerted on, and ReconcileParked keeps looking for it at Stripe.
	// Like pending, it is not settled: Stripe's refund, if it appears,
	// moves it to pending, succeeded or failed.
	StatusRequiresAttention = "requires_attention"
)

// Reasons Stripe accepts for a refund
// (https://docs.stripe.com/api/refunds/create#create_refund-reason).
var Reasons = []string{"requested_by_customer", "duplicate", "fraudulent"}

// Refund is a refund as the API returns it and order.refunded carries it.
type Refund struct {
	ID             string    `json:"id"`
	OrderID        string    `json:"order_id"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Reason         *string   `json:"reason"`
	Status         string    `json:"status"`
	StripeRefundID *string   `json:"stripe_refund_id"`
	FailureReason  *string   `json:"failure_reason,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
}

// Coded errors the refund endpoint answers with. The 409s are final
// outcomes, stored under the key and replayed.
var (
	ErrOrderNotRefundable = problem.New(problem.CodeOrderNotRefundable,
		"Only an order that is paid or partially_refunded can be refunded (or a refunded one whose refund Stripe failed afterwards).")
	ErrRefundExceedsPayment = problem.New(problem.CodeRefundExceedsPayment,
		"The amount is more than what is left to refund: what the order paid less its succeeded and pending refunds.")
)

// StripeRefund is Stripe's state of one refund
// (https://docs.stripe.com/api/refunds/object), as a create, a retrieve, a
// list or a webhook event gives it.
type StripeRefund struct {
	// ID is Stripe's id, "re_…".
	ID              string
	PaymentIntentID string
	Amount          int64
	Currency        string
	// Status is pending, requires_action, succeeded, failed or canceled.
	Status string
	// FailureReason is set when Status is failed, e.g. lost_or_stolen_card.
	FailureReason string
	// Metadata holds refund_id, order_id and tenant_id for refunds we made.
	Metadata map[string]string
	// Reason is Stripe's reason (requested_by_customer, duplicate,
	// fraudulent), "" for none.
	Reason string
	// Created is when Stripe created it (Unix seconds, Stripe's clock).
	Created int64
	// OrderID and TenantID name the order of the refund's PaymentIntent,
	// from the PaymentIntent's metadata, when the caller read it: how a
	// refund made outside the service (the Dashboard), which carries none
	// of our metadata, finds its order (Apply adopts it). Empty otherwise.
	OrderID, TenantID string
}

// CreateParams is one POST /v1/refunds.
type CreateParams struct {
	// IdempotencyKey is the attempt's key (stripestep.Key).
	IdempotencyKey  string
	PaymentIntentID string
	Amount          int64
	// Reason is one of Reasons, or empty.
	Reason string
	// RefundID, OrderID and TenantID go into the refund's metadata; RefundID
	// is what reconciliation matches on.
	RefundID, OrderID, TenantID string
}

// Stripe is what refunds need of Stripe's Refund API;
// *payments.Client is the implementation.
//
// CreateRefund sends p.IdempotencyKey as Stripe's Idempotency-Key and may
// retry with it; it returns the refund Stripe created (whatever its
// status), or an error that stripestep.OutcomeOf classifies: a
// stripestep.Refusal or stripestep.ErrRejected when Stripe refused the
// request itself (a 4xx: nothing was created and the same request cannot
// succeed), stripestep.ErrIndeterminate for a 500 Stripe stored under the
// key (the key can never succeed again, and the refund may or may not
// exist, or appear later: https://docs.stripe.com/api/idempotent_requests),
// and any other error when Stripe gave no answer (a timeout, unreachable,
// 503s until the retries ran out, our credentials refused), which leaves
// the key usable: resending it either runs the request or replays what it
// did. GetRefund retrieves one refund by id; ListRefunds lists every refund
// of a PaymentIntent (strongly consistent, unlike search).
type Stripe interface {
	CreateRefund(ctx context.Context, p CreateParams) (StripeRefund, error)
	GetRefund(ctx context.Context, id string) (StripeRefund, error)
	ListRefunds(ctx context.Context, paymentIntentID string) ([]StripeRefund, error)
}

// OutsideStripe is what the refund reconciler needs of Stripe to find the
// refunds made outside the service (in the Dashboard); *payments.Client
// implements it. ListRefundsSince lists the account's refunds created at
// or after since (Stripe's clock), every page; IntentOrder returns the
// order and tenant a PaymentIntent names in its metadata ("" for none).
// An error means Stripe did not answer.
type OutsideStripe interface {
	ListRefundsSince(ctx context.Context, since time.Time) ([]StripeRefund, error)
	IntentOrder(ctx context.Context, paymentIntentID string) (orderID, tenantID string, err error)
}
