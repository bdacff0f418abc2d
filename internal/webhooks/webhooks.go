// Package webhooks receives Stripe's webhooks (POST /v1/webhooks/stripe,
// CONTRACT.md "Stripe webhooks"; https://docs.stripe.com/webhooks).
//
// Stripe delivers each event at least once, resends an event that did not
// get a 2xx for up to 3 days, and keeps no order: "Stripe doesn't guarantee
// the delivery of events in the order in which they're generated"
// (https://docs.stripe.com/webhooks#event-ordering). So the handler:
//
//   - verifies the Stripe-Signature over the raw body, read once before
//     anything decodes it (https://docs.stripe.com/webhooks#verify-events);
//     a body re-encoded by a framework never verifies;
//   - records the event id in the inbox (consumer stripe_webhook) in the
//     same transaction as the state change: a redelivery, sequential or
//     concurrent, changes nothing; a failure rolls both back and answers 5xx,
//     so Stripe resends it;
//   - applies state only forward, and when the event's state is one that a
//     later change may have overtaken (anything but succeeded or canceled)
//     while our order still waits for its payment, or says money moved for
//     an order that gave up on its payment (a stray payment, refunded),
//     retrieves the PaymentIntent from Stripe (GET by id is strongly
//     consistent) and applies that instead. The reconciler ends in the same function, so the
//     push and the poll paths converge on Stripe's state.
package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/httpbody"
	"github.com/onceonly/checkout/internal/inbox"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/problem"
)

// Route is the endpoint's method and path.
const Route = "POST /v1/webhooks/stripe"

// Path is the endpoint's path.
const Path = "/v1/webhooks/stripe"

// Consumer is the inbox consumer name under which event ids are recorded.
const Consumer = "stripe_webhook"

// DefaultMaxBodyBytes bounds a delivery's body (256 KiB). Stripe's events
// are a few KiB; a PaymentIntent with every field expanded stays far below.
const DefaultMaxBodyBytes = 256 << 10

// Event types the handler acts on (https://docs.stripe.com/api/events/types).
const (
	TypePaymentIntentSucceeded      = "payment_intent.succeeded"
	TypePaymentIntentPaymentFailed  = "payment_intent.payment_failed"
	TypePaymentIntentCanceled       = "payment_intent.canceled"
	TypePaymentIntentRequiresAction = "payment_intent.requires_action"
	TypeChargeRefunded              = "charge.refunded"
	TypeRefundCreated               = "refund.created"
	TypeRefundUpdated               = "refund.updated"
	TypeRefundFailed                = "refund.failed"
)

var handledTypes = []string{
	TypePaymentIntentSucceeded, TypePaymentIntentPaymentFailed, TypePaymentIntentCanceled,
	TypePaymentIntentRequiresAction, TypeChargeRefunded, TypeRefundCreated, TypeRefundUpdated, TypeRefundFailed,
}

func handled(typ string) bool { return slices.Contains(handledTypes, typ) }

// ErrNotOurs is wrapped by Orders and Refunds errors for an object the
// service does not know (no such order for the tenant, no such refund): the
// event is answered 200 and ignored.
var ErrNotOurs = errors.New("not an object of this service")

// ErrStripe is wrapped by an Orders error when a call to Stripe made while
// applying an event got no usable answer: the event is answered 502
// payment_provider_unavailable, nothing recorded, and Stripe resends it.
var ErrStripe = errors.New("stripe did not answer")

// Orders is what the handler needs of the checkout saga.
type Orders interface {
	// OrderStatus returns the status of tenant's order id (CONTRACT.md's
	// order statuses), or an error wrapping ErrNotOurs when there is none.
	OrderStatus(ctx context.Context, tenantID, orderID string) (orders.Status, error)
	// ApplyPaymentIntent applies Stripe's state of a PaymentIntent to the
	// order its metadata names, only forward, with all that goes with it
	// (closing the PaymentIntent before the order leaves the way to paid,
	// refunding a stray payment: checkout.Service.ApplyPaymentIntent). It
	// calls record first inside the transaction that applies the change,
	// and applies nothing when record returns false. It reports
	// changed=false when the order is already where pi would take it or
	// further. An error wrapping ErrNotOurs means the order is unknown
	// (record was not called); one wrapping ErrStripe means a call to Stripe
	// failed; any other error rolled the transaction back, the record with
	// it.
	ApplyPaymentIntent(ctx context.Context, pi PaymentIntent, record func(tx *gorm.DB) (first bool, err error)) (changed bool, err error)
	// SettleStrayPayment is called, outside any transaction, with the
	// PaymentIntent of a stray payment's refund that Stripe failed: if the
	// order it names is not paid and never will be through pi (failed,
	// canceled, or another PaymentIntent recorded), it refunds pi again
	// (idempotently) and counts it. An error means Stripe or the database
	// did not answer.
	SettleStrayPayment(ctx context.Context, pi PaymentIntent) error
}

// PaymentIntents retrieves a PaymentIntent from Stripe (GET
// /v1/payment_intents/{id}, strongly consistent). An error means Stripe did
// not answer with the object; the handler answers 5xx and Stripe resends.
type PaymentIntents interface {
	RetrievePaymentIntent(ctx context.Context, id string) (PaymentIntent, error)
}

// The coded errors the endpoint answers with (internal/problem renders them).
var (
	ErrBadSignature = problem.New(problem.CodeInvalidSignature,
		"The Stripe-Signature header is missing, malformed, does not sign this exact body with the endpoint's secret, or is older than 300 seconds.")
	ErrBodyTooLarge = problem.New(problem.CodePayloadTooLarge,
		"A webhook body is at most 256 KiB.")
	ErrNotAnEvent = problem.New(problem.CodeMalformedEvent,
		"The body is signed but is not a Stripe event with an id, a type and a data.object.")
	ErrUnavailable = problem.New(problem.CodeUnavailable,
		"The event could not be recorded; nothing was changed. Stripe resends it.")
	ErrStripeUnavailable = problem.New(problem.CodePaymentProviderUnavailable,
		"The PaymentIntent could not be retrieved from Stripe to settle the event; nothing was changed. Stripe resends it.")
	// errUnreadable answers a body that could not be read whole.
	errUnreadable = problem.New(problem.CodeMalformedEvent, "The request body could not be read.")
)

// Handler serves POST /v1/webhooks/stripe. It needs no bearer key: the
// signature is the authentication. DB, Verifier, Orders and Stripe are
// required; Refunds may be nil (refund events are then ignored).
type Handler struct {
	DB       *gorm.DB
	Verifier Verifier
	Orders   Orders
	Stripe   PaymentIntents
	Refunds  Refunds
	Logger   *slog.Logger
	Metrics  *Metrics
	// MaxBodyBytes bounds the body (zero: DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// WorkTimeout bounds one event's work, which runs detached from the
	// client's connection (zero: 20s).
	WorkTimeout time.Duration
}

// received is the body of a 200 answer.
type received struct {
	Received bool   `json:"received"`
	Outcome  string `json:"outcome"`
}

// ServeHTTP answers 200 {"received":true,"outcome":…} for an event applied,
// duplicate, stale or ignored; 400 invalid_signature (nothing read or
// changed); 413 payload_too_large; 400 malformed_event; 503 unavailable when
// the database fails and 502 payment_provider_unavailable when Stripe does
// (nothing changed; Stripe resends).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	max := h.MaxBodyBytes
	if max <= 0 {
		max = DefaultMaxBodyBytes
	}
	// The raw bytes, read once: the signature covers exactly these.
	payload, err := httpbody.Read(w, r, max)
	if err != nil {
		h.Metrics.count(typeUnverified, OutcomeError)
		if errors.Is(err, httpbody.ErrTooLarge) {
			problem.Write(w, ErrBodyTooLarge)
			return
		}
		problem.Write(w, errUnreadable)
		return
	}
	if err := h.Verifier.Verify(payload, r.Header.Get("Stripe-Signature")); err != nil {
		h.Metrics.count(typeUnverified, OutcomeInvalidSignature)
		h.logger().WarnContext(r.Context(), "stripe webhook refused", "err", err)
		problem.Write(w, ErrBadSignature)
		return
	}
	ev, err := DecodeEvent(payload)
	if err != nil {
		h.Metrics.count(typeUnverified, OutcomeError)
		h.logger().ErrorContext(r.Context(), "stripe webhook signed but malformed", "err", err)
		problem.Write(w, ErrNotAnEvent)
		return
	}

	// Once verified, the work must not depend on Stripe keeping the
	// connection open: a rollback would only make it resend.
	timeout := h.WorkTimeout
	if timeout <= 0 {
		timeout = 20 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), timeout)
	defer cancel()
	log := h.logger().With("event_id", ev.ID, "event_type", ev.Type)

	outcome, err := h.handle(ctx, ev)
	if err != nil {
		h.Metrics.count(ev.Type, OutcomeError)
		log.WarnContext(ctx, "stripe webhook not processed; Stripe resends it", "err", err)
		problem.Write(w, err)
		return
	}
	h.Metrics.count(ev.Type, outcome)
	level := slog.LevelDebug
	if outcome == OutcomeApplied {
		level = slog.LevelInfo
	}
	log.Log(ctx, level, "stripe webhook", "outcome", outcome, "api_version", ev.APIVersion)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	json.NewEncoder(w).Encode(received{Received: true, Outcome: outcome})
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Logger
}

// handle dispatches a verified event by type. Errors are problems.
func (h *Handler) handle(ctx context.Context, ev Event) (string, error) {
	switch ev.Type {
	case TypePaymentIntentSucceeded, TypePaymentIntentPaymentFailed, TypePaymentIntentCanceled:
		pi, err := DecodePaymentIntent(ev.Data.Object)
		if err != nil {
			return "", problem.Wrap(ErrNotAnEvent, err)
		}
		if !pi.Ours() {
			return OutcomeIgnored, nil
		}
		return h.paymentIntent(ctx, ev, pi)
	case TypePaymentIntentRequiresAction:
		// Informational: the checkout answered 202 with the next action
		// already, and the outcome arrives as succeeded or payment_failed.
		return OutcomeIgnored, nil
	case TypeChargeRefunded, TypeRefundCreated, TypeRefundUpdated, TypeRefundFailed:
		if h.Refunds == nil {
			// No refunds feature is wired (internal/api leaves Refunds nil
			// when its Stripe client has no Refund API): the service has no
			// refund a refund event could be about, so the event is
			// acknowledged and ignored rather than resent for 3 days.
			return OutcomeIgnored, nil
		}
		rs, embedded, pi, err := DecodeRefunds(ev.Data.Object)
		if err != nil {
			return "", problem.Wrap(ErrNotAnEvent, err)
		}
		if !embedded {
			// A charge.refunded that names its PaymentIntent only: the
			// refunds are Stripe's to list. A refund Stripe made immediately
			// (succeeded at once) gets no refund.updated, so this event is
			// the one that settles it when the create's answer was lost.
			if pi == "" {
				return OutcomeIgnored, nil
			}
			if dup, err := inbox.Seen(ctx, h.DB, Consumer, ev.ID); err != nil {
				return "", problem.Wrap(ErrUnavailable, err)
			} else if dup {
				return OutcomeDuplicate, nil
			}
			if rs, err = h.Refunds.RefundsOf(ctx, pi); err != nil {
				return "", problem.Wrap(ErrStripeUnavailable, err)
			}
		}
		return h.refunds(ctx, ev, rs)
	}
	return OutcomeIgnored, nil
}

// errIgnore rolls back a transaction whose object turned out not to be ours.
var errIgnore = errors.New("ignore")

// paymentIntent applies a payment_intent.* event: the event's state when it
// is final at Stripe or our order no longer waits for it, otherwise the
// PaymentIntent as Stripe has it now.
func (h *Handler) paymentIntent(ctx context.Context, ev Event, pi PaymentIntent) (string, error) {
	// A redelivery of an event already recorded needs no call to Stripe.
	// This read is only a shortcut: inbox.Record below decides.
	if dup, err := inbox.Seen(ctx, h.DB, Consumer, ev.ID); err != nil {
		return "", problem.Wrap(ErrUnavailable, err)
	} else if dup {
		return OutcomeDuplicate, nil
	}

	status, err := h.Orders.OrderStatus(ctx, pi.TenantID, pi.OrderID)
	switch {
	case errors.Is(err, ErrNotOurs):
		return OutcomeIgnored, nil
	case err != nil:
		return "", problem.Wrap(ErrUnavailable, err)
	}
	state := pi
	// An order still on the way to paid (orders.Status.Waiting) waits for
	// its payment's outcome, and an event that is not final for the
	// PaymentIntent (e.g. requires_payment_method) may have been overtaken
	// since (a later confirmation succeeded): delivery order cannot tell.
	// An event that says money moved for an order that gave up on its
	// payment contradicts what the service saw when it closed that
	// PaymentIntent, and would be refunded as a stray payment: money moves
	// on Stripe's word, not on an event's. In both cases Stripe can tell
	// (GET by id is strongly consistent), and its current state is what is
	// applied.
	overtaken := !pi.Status.Final() && status.Waiting()
	contradicts := pi.Status.MovesMoney() && status.LeavesTheWayToPaid()
	if overtaken || contradicts {
		cur, err := h.Stripe.RetrievePaymentIntent(ctx, pi.ID)
		if err != nil {
			return "", problem.Wrap(ErrStripeUnavailable, fmt.Errorf("retrieve %s: %w", pi.ID, err))
		}
		if cur.OrderID != pi.OrderID || cur.TenantID != pi.TenantID {
			return "", problem.Wrap(ErrStripeUnavailable, fmt.Errorf("retrieve %s: metadata names order %s/%s, the event %s/%s",
				pi.ID, cur.TenantID, cur.OrderID, pi.TenantID, pi.OrderID))
		}
		state = cur
	}

	duplicate := false
	changed, err := h.Orders.ApplyPaymentIntent(ctx, state, func(tx *gorm.DB) (bool, error) {
		first, err := inbox.Record(ctx, tx, Consumer, ev.ID)
		duplicate = err == nil && !first
		return first, err
	})
	switch {
	case errors.Is(err, ErrNotOurs):
		return OutcomeIgnored, nil
	case errors.Is(err, ErrStripe):
		return "", problem.Wrap(ErrStripeUnavailable, err)
	case err != nil:
		return "", problem.Wrap(ErrUnavailable, err)
	case duplicate:
		return OutcomeDuplicate, nil
	case changed:
		return OutcomeApplied, nil
	}
	return OutcomeStale, nil
}

// refunds applies the refunds an event carries, all in one transaction with
// the inbox record. A refund made outside the service (the Dashboard: none
// of our metadata) is first given the order its PaymentIntent names in its
// metadata, read from Stripe (GET by id, strongly consistent), so that it
// reaches that order's refunds (Refunds.ApplyRefund adopts it when the
// order was paid through that PaymentIntent).
func (h *Handler) refunds(ctx context.Context, ev Event, rs []Refund) (string, error) {
	if slices.ContainsFunc(rs, Refund.MadeOutside) {
		// A redelivery needs no call to Stripe; inbox.Record decides.
		if dup, err := inbox.Seen(ctx, h.DB, Consumer, ev.ID); err != nil {
			return "", problem.Wrap(ErrUnavailable, err)
		} else if dup {
			return OutcomeDuplicate, nil
		}
	}
	ours := rs[:0:0]
	for _, r := range rs {
		if r.MadeOutside() {
			pi, err := h.Stripe.RetrievePaymentIntent(ctx, r.PaymentIntentID)
			if err != nil {
				return "", problem.Wrap(ErrStripeUnavailable, fmt.Errorf("retrieve %s of refund %s: %w", r.PaymentIntentID, r.ID, err))
			}
			r.IntentOrderID, r.IntentTenantID = pi.OrderID, pi.TenantID
			if r.OrderID != "" && (r.Status == "failed" || r.Status == "canceled") {
				// The refund of a stray payment (ours: order metadata, no
				// refund of ours) that Stripe failed: sent again, under
				// the next attempt's key, before the event is recorded.
				if err := h.Orders.SettleStrayPayment(ctx, pi); err != nil {
					return "", problem.Wrap(ErrStripeUnavailable, fmt.Errorf("refund stray payment %s again: %w", pi.ID, err))
				}
			}
		}
		if r.Ours() || (r.IntentOrderID != "" && r.IntentTenantID != "") {
			ours = append(ours, r)
		}
	}
	if len(ours) == 0 {
		return OutcomeIgnored, nil
	}
	var outcome string
	err := postgres.WithTx(ctx, h.DB, func(tx *gorm.DB) error {
		first, err := inbox.Record(ctx, tx, Consumer, ev.ID)
		if err != nil {
			return err
		}
		if !first {
			outcome = OutcomeDuplicate
			return nil
		}
		outcome = OutcomeStale
		known := false
		for _, r := range ours {
			changed, err := h.Refunds.ApplyRefund(ctx, tx, r)
			switch {
			case errors.Is(err, ErrNotOurs):
				continue
			case err != nil:
				return err
			}
			known = true
			if changed {
				outcome = OutcomeApplied
			}
		}
		if !known {
			return errIgnore
		}
		return nil
	})
	switch {
	case errors.Is(err, errIgnore):
		return OutcomeIgnored, nil
	case err != nil:
		return "", problem.Wrap(ErrUnavailable, err)
	}
	return outcome, nil
}
