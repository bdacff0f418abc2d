package webhooks

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/onceonly/checkout/internal/stripeintent"
)

// DefaultTolerance is how old a Stripe-Signature timestamp may be: 300s, as
// stripe-go's webhook.DefaultTolerance and Stripe's libraries use
// (https://docs.stripe.com/webhooks#verify-events, "replay attacks").
const DefaultTolerance = webhook.DefaultTolerance

// DefaultSecret is the development signing secret (STRIPE_WEBHOOK_SECRET);
// the Stripe emulator signs with the same default.
const DefaultSecret = "whsec_test_checkout"

// ErrInvalidSignature is returned by Verify for a body that the secret did
// not sign: no Stripe-Signature header, a malformed one, no v1 signature
// that matches the exact bytes received, or a timestamp older than the
// tolerance.
var ErrInvalidSignature = errors.New("invalid Stripe-Signature")

// Verifier checks Stripe-Signature headers
// (https://docs.stripe.com/webhooks#verify-events): HMAC-SHA256 with the
// endpoint's signing secret over "{t}.{raw body}", compared in constant time
// with each v1 signature of the header.
type Verifier struct {
	// Secret is the endpoint's signing secret, "whsec_…".
	Secret string
	// Tolerance is the oldest accepted timestamp (zero: DefaultTolerance).
	Tolerance time.Duration
}

// Verify checks that header signs payload, byte for byte, with v.Secret and
// a timestamp within the tolerance, using stripe-go v76's
// webhook.ConstructEventWithOptions. It returns an error wrapping
// ErrInvalidSignature otherwise.
//
// The event's API version is deliberately not compared with stripe-go's
// (IgnoreAPIVersionMismatch): after an account upgrade every event would be
// refused, and Stripe would resend each for 3 days. A signed body that
// stripe-go cannot decode into its Event type (a field whose shape differs
// in another API version) is still accepted here: the handler decodes the
// few fields it uses itself (see DecodeEvent).
func (v Verifier) Verify(payload []byte, header string) error {
	tol := v.Tolerance
	if tol <= 0 {
		tol = DefaultTolerance
	}
	_, err := webhook.ConstructEventWithOptions(payload, header, v.Secret, webhook.ConstructEventOptions{
		Tolerance:                tol,
		IgnoreAPIVersionMismatch: true,
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, webhook.ErrNotSigned), errors.Is(err, webhook.ErrInvalidHeader),
		errors.Is(err, webhook.ErrNoValidSignature), errors.Is(err, webhook.ErrTooOld):
		return fmt.Errorf("%w: %w", ErrInvalidSignature, err)
	default:
		// The signature matched (stripe-go checks it before decoding); only
		// stripe-go's own decoding of the body failed.
		return nil
	}
}

// Event is what the handler reads of a Stripe event
// (https://docs.stripe.com/api/events/object). Unknown fields are ignored,
// so an event rendered in another API version decodes as long as these do.
type Event struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	APIVersion string `json:"api_version"`
	// Created is when Stripe created the event, in Unix seconds.
	Created int64 `json:"created"`
	Data    struct {
		// Object is the resource as it was when the event was created.
		Object json.RawMessage `json:"object"`
	} `json:"data"`
}

// ErrMalformedEvent is returned by DecodeEvent for a body that is not a
// JSON event with an id, a type and a data.object.
var ErrMalformedEvent = errors.New("malformed Stripe event")

// DecodeEvent decodes the fields Event names from payload.
func DecodeEvent(payload []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(payload, &e); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrMalformedEvent, err)
	}
	if e.ID == "" || e.Type == "" || len(e.Data.Object) == 0 {
		return Event{}, fmt.Errorf("%w: id, type and data.object are required", ErrMalformedEvent)
	}
	return e, nil
}

// PaymentIntent is Stripe's state of one PaymentIntent
// (https://docs.stripe.com/api/payment_intents/object), as a webhook's
// data.object or a GET /v1/payment_intents/{id} gives it.
type PaymentIntent struct {
	ID       string
	Status   stripeintent.Status
	Amount   int64
	Currency string
	// OrderID and TenantID come from metadata[order_id] and
	// metadata[tenant_id], which every PaymentIntent the service creates
	// carries.
	OrderID  string
	TenantID string
	// LastErrorCode and LastDeclineCode are last_payment_error's code and
	// decline_code: why the latest attempt failed.
	LastErrorCode, LastDeclineCode string
	// CancellationReason is set when Status is canceled.
	CancellationReason string
	// NextAction (raw JSON) and ClientSecret are set while Status is
	// requires_action.
	NextAction   json.RawMessage
	ClientSecret string
}

// Ours reports whether the PaymentIntent names an order of a tenant.
func (pi PaymentIntent) Ours() bool { return pi.OrderID != "" && pi.TenantID != "" }

// paymentIntentJSON is the wire form. Metadata values are decoded loosely:
// a value that is not a string is ignored rather than failing the event.
type paymentIntentJSON struct {
	ID                 string              `json:"id"`
	Object             string              `json:"object"`
	Status             stripeintent.Status `json:"status"`
	Amount             int64               `json:"amount"`
	Currency           string              `json:"currency"`
	Metadata           map[string]any      `json:"metadata"`
	CancellationReason string              `json:"cancellation_reason"`
	ClientSecret       string              `json:"client_secret"`
	NextAction         json.RawMessage     `json:"next_action"`
	LastPaymentError   *struct {
		Code        string `json:"code"`
		DeclineCode string `json:"decline_code"`
	} `json:"last_payment_error"`
}

// DecodePaymentIntent decodes a PaymentIntent object (data.object of a
// payment_intent.* event, or the body of a retrieve).
func DecodePaymentIntent(raw []byte) (PaymentIntent, error) {
	var j paymentIntentJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return PaymentIntent{}, fmt.Errorf("%w: payment intent: %w", ErrMalformedEvent, err)
	}
	if j.ID == "" || (j.Object != "" && j.Object != "payment_intent") {
		return PaymentIntent{}, fmt.Errorf("%w: not a payment intent (object %q, id %q)", ErrMalformedEvent, j.Object, j.ID)
	}
	pi := PaymentIntent{ID: j.ID, Status: j.Status, Amount: j.Amount, Currency: j.Currency,
		CancellationReason: j.CancellationReason, ClientSecret: j.ClientSecret}
	if len(j.NextAction) > 0 && string(j.NextAction) != "null" {
		pi.NextAction = j.NextAction
	}
	pi.OrderID, _ = j.Metadata["order_id"].(string)
	pi.TenantID, _ = j.Metadata["tenant_id"].(string)
	if e := j.LastPaymentError; e != nil {
		pi.LastErrorCode, pi.LastDeclineCode = e.Code, e.DeclineCode
	}
	return pi, nil
}
