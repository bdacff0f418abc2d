package stripeemu

import (
	"crypto/rand"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// paymentIntent is the subset of Stripe's PaymentIntent object
// (https://docs.stripe.com/api/payment_intents/object) the emulator returns;
// enough for stripe-go v76 to decode and for a checkout to read its outcome.
type paymentIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountCapturable   int64             `json:"amount_capturable"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ClientSecret       string            `json:"client_secret"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Description        *string           `json:"description"`
	LastPaymentError   *apiError         `json:"last_payment_error"`
	LatestCharge       *string           `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	NextAction         *nextAction       `json:"next_action"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	Status             string            `json:"status"`
}

// nextAction is the PaymentIntent's next_action for requires_action.
type nextAction struct {
	Type string `json:"type"`
}

// apiError is Stripe's error object (https://docs.stripe.com/api/errors), sent
// as {"error": apiError}.
type apiError struct {
	Type          string         `json:"type"`
	Code          string         `json:"code,omitempty"`
	DeclineCode   string         `json:"decline_code,omitempty"`
	Message       string         `json:"message"`
	Param         string         `json:"param,omitempty"`
	Charge        string         `json:"charge,omitempty"`
	DocURL        string         `json:"doc_url,omitempty"`
	PaymentIntent *paymentIntent `json:"payment_intent,omitempty"`
}

// errorBody is the envelope of every Stripe error response.
type errorBody struct {
	Error *apiError `json:"error"`
}

// decline is how a test payment method fails.
type decline struct {
	code, declineCode, message string
}

// declines maps Stripe's test PaymentMethods that decline on confirm
// (https://docs.stripe.com/testing#declined-payments) to their error.
var declines = map[string]decline{
	"pm_card_chargeDeclined":                  {"card_declined", "generic_decline", "Your card was declined."},
	"pm_card_visa_chargeDeclined":             {"card_declined", "generic_decline", "Your card was declined."},
	"pm_card_chargeDeclinedInsufficientFunds": {"card_declined", "insufficient_funds", "Your card has insufficient funds."},
	"pm_card_chargeDeclinedExpiredCard":       {"expired_card", "expired_card", "Your card has expired."},
}

// requiresAction lists test PaymentMethods whose confirmation needs 3D Secure,
// leaving the PaymentIntent in requires_action.
var requiresAction = map[string]bool{
	"pm_card_authenticationRequired": true,
	"pm_card_threeDSecure2Required":  true,
}

// createParams are the parsed parameters of POST /v1/payment_intents.
type createParams struct {
	amount        int64
	currency      string
	paymentMethod string
	confirm       bool
	description   *string
	captureMethod string
	pmTypes       []string
	metadata      map[string]string
}

// simpleParams are top-level parameters accepted and ignored beyond
// validation; anything else is rejected like Stripe does (parameter_unknown).
var simpleParams = map[string]bool{
	"customer": true, "receipt_email": true, "return_url": true, "statement_descriptor": true,
	"setup_future_usage": true, "off_session": true, "confirmation_method": true,
}

// parseCreate decodes a form body as stripe-go encodes it: scalars, nested
// hashes as metadata[order_id], arrays as payment_method_types[0] or [].
func parseCreate(v url.Values) (createParams, *apiError) {
	p := createParams{currency: "", metadata: map[string]string{}, captureMethod: "automatic"}
	type indexed struct {
		i int
		v string
	}
	var types []indexed
	for key, vals := range v {
		val := vals[len(vals)-1]
		switch {
		case key == "amount":
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return p, invalid("parameter_invalid_integer", "amount", "Invalid integer: "+val)
			}
			p.amount = n
		case key == "currency":
			p.currency = strings.ToLower(val)
		case key == "payment_method":
			p.paymentMethod = val
		case key == "confirm":
			b, err := strconv.ParseBool(val)
			if err != nil {
				return p, invalid("parameter_invalid_boolean", "confirm", "Invalid boolean: "+val)
			}
			p.confirm = b
		case key == "description":
			p.description = &val
		case key == "capture_method":
			if val != "automatic" && val != "automatic_async" && val != "manual" {
				return p, invalid("parameter_invalid_string", "capture_method", "Invalid capture_method: "+val)
			}
			p.captureMethod = val
		case strings.HasPrefix(key, "metadata[") && strings.HasSuffix(key, "]"):
			p.metadata[key[len("metadata["):len(key)-1]] = val
		case strings.HasPrefix(key, "payment_method_types[") && strings.HasSuffix(key, "]"):
			idx := key[len("payment_method_types[") : len(key)-1]
			if idx == "" {
				for _, x := range vals {
					types = append(types, indexed{len(types), x})
				}
				continue
			}
			i, err := strconv.Atoi(idx)
			if err != nil {
				return p, invalid("parameter_unknown", key, "Received unknown parameter: "+key)
			}
			types = append(types, indexed{i, val})
		case strings.HasPrefix(key, "expand[") || strings.HasPrefix(key, "automatic_payment_methods[") ||
			strings.HasPrefix(key, "payment_method_options[") || simpleParams[key]:
		default:
			return p, invalid("parameter_unknown", key, "Received unknown parameter: "+key)
		}
	}
	sort.Slice(types, func(a, b int) bool { return types[a].i < types[b].i })
	for _, t := range types {
		p.pmTypes = append(p.pmTypes, t.v)
	}
	if len(p.pmTypes) == 0 {
		p.pmTypes = []string{"card"}
	}
	switch {
	case v.Get("amount") == "":
		return p, invalid("parameter_missing", "amount", "Missing required param: amount.")
	case p.amount < 1:
		return p, invalid("amount_too_small", "amount", "Amount must be at least 1 in the currency's minor unit.")
	case p.currency == "":
		return p, invalid("parameter_missing", "currency", "Missing required param: currency.")
	case len(p.currency) != 3:
		return p, invalid("parameter_invalid_string", "currency", "Invalid currency: "+p.currency)
	case p.confirm && p.paymentMethod == "":
		return p, &apiError{Type: "invalid_request_error", Code: "payment_intent_unexpected_state",
			Message: "You cannot confirm this PaymentIntent because it's missing a payment method."}
	}
	return p, nil
}

// invalid builds an invalid_request_error for a bad parameter.
func invalid(code, param, msg string) *apiError {
	return &apiError{Type: "invalid_request_error", Code: code, Param: param, Message: msg}
}

// newID returns a Stripe-looking object id such as "pi_3MtwBwLkdIwHu7ix28a3tqPa".
func newID(prefix string) string {
	return prefix + "_" + rand.Text()[:24]
}

// canonical returns the parameters in one form whatever their order on the
// wire: keys sorted, values kept in their order. Two requests are "the same
// parameters" for Stripe's idempotency rules when their canonical forms match.
func canonical(v url.Values) string {
	return v.Encode()
}
