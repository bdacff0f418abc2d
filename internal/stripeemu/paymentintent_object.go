package stripeemu

import (
	"crypto/rand"
	"encoding/json"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// paymentIntent is the subset of Stripe's PaymentIntent object
// (https://docs.stripe.com/api/payment_intents/object) the emulator returns;
// enough for stripe-go v76 to decode and for a checkout to read its outcome.
// Amounts are in the currency's minor unit; times are Unix seconds.
type paymentIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountCapturable   int64             `json:"amount_capturable"`
	AmountReceived     int64             `json:"amount_received"`
	CanceledAt         *int64            `json:"canceled_at"`
	CancellationReason *string           `json:"cancellation_reason"`
	CaptureMethod      string            `json:"capture_method"`
	ClientSecret       string            `json:"client_secret"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Description        *string           `json:"description"`
	LastPaymentError   *apiError         `json:"last_payment_error"`
	LatestCharge       expandable        `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	NextAction         *nextAction       `json:"next_action"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	Status             string            `json:"status"`
}

// The PaymentIntent statuses (https://docs.stripe.com/payments/paymentintents/lifecycle).
const (
	statusRequiresPaymentMethod = "requires_payment_method"
	statusRequiresConfirmation  = "requires_confirmation"
	statusRequiresAction        = "requires_action"
	statusRequiresCapture       = "requires_capture"
	statusProcessing            = "processing"
	statusSucceeded             = "succeeded"
	statusCanceled              = "canceled"
)

// expandable is an expandable field: the id of the object, or the object
// itself when the request asked for it with expand[].
type expandable struct {
	id  string
	obj any
}

// MarshalJSON encodes null, the id, or the expanded object.
func (x expandable) MarshalJSON() ([]byte, error) {
	switch {
	case x.obj != nil:
		return json.Marshal(x.obj)
	case x.id == "":
		return []byte("null"), nil
	}
	return json.Marshal(x.id)
}

// nextAction is the PaymentIntent's next_action in requires_action
// (https://docs.stripe.com/api/payment_intents/object#payment_intent_object-next_action):
// use_stripe_sdk for Stripe.js handleNextAction, or redirect_to_url when the
// confirmation carried a return_url.
type nextAction struct {
	Type          string         `json:"type"`
	UseStripeSDK  *useStripeSDK  `json:"use_stripe_sdk,omitempty"`
	RedirectToURL *redirectToURL `json:"redirect_to_url,omitempty"`
}

// useStripeSDK is next_action.use_stripe_sdk; Stripe documents it as opaque,
// for Stripe.js only.
type useStripeSDK struct {
	Type          string `json:"type"`
	ThreeDSSource string `json:"three_d_secure_2_source"`
}

// redirectToURL is next_action.redirect_to_url.
type redirectToURL struct {
	URL       string `json:"url"`
	ReturnURL string `json:"return_url"`
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

// testCard is how one of Stripe's test PaymentMethods behaves on confirm.
type testCard struct {
	decline *decline // non-nil: declined with this card_error
	threeDS bool     // confirmation needs 3D Secure: requires_action
}

// testPaymentMethods are Stripe's test PaymentMethod ids
// (https://docs.stripe.com/testing#cards, #declined-payments,
// #authentication-and-setup). Any other id is a 400 resource_missing, as an
// unknown PaymentMethod is at Stripe.
var testPaymentMethods = map[string]testCard{
	"pm_card_visa":               {},
	"pm_card_visa_debit":         {},
	"pm_card_mastercard":         {},
	"pm_card_mastercard_debit":   {},
	"pm_card_mastercard_prepaid": {},
	"pm_card_amex":               {},
	"pm_card_discover":           {},
	"pm_card_diners":             {},
	"pm_card_jcb":                {},
	"pm_card_unionpay":           {},
	"pm_card_us":                 {},
	"pm_card_ca":                 {},
	"pm_card_gb":                 {},
	"pm_card_de":                 {},
	"pm_card_fr":                 {},
	"pm_card_bypassPending":      {},

	"pm_card_chargeDeclined":                           {decline: &decline{"card_declined", "generic_decline", "Your card was declined."}},
	"pm_card_visa_chargeDeclined":                      {decline: &decline{"card_declined", "generic_decline", "Your card was declined."}},
	"pm_card_chargeDeclinedInsufficientFunds":          {decline: &decline{"card_declined", "insufficient_funds", "Your card has insufficient funds."}},
	"pm_card_chargeDeclinedLostCard":                   {decline: &decline{"card_declined", "lost_card", "Your card was declined."}},
	"pm_card_chargeDeclinedStolenCard":                 {decline: &decline{"card_declined", "stolen_card", "Your card was declined."}},
	"pm_card_chargeDeclinedFraudulent":                 {decline: &decline{"card_declined", "fraudulent", "Your card was declined."}},
	"pm_card_chargeDeclinedExpiredCard":                {decline: &decline{"expired_card", "expired_card", "Your card has expired."}},
	"pm_card_chargeDeclinedIncorrectCvc":               {decline: &decline{"incorrect_cvc", "incorrect_cvc", "Your card's security code is incorrect."}},
	"pm_card_chargeDeclinedProcessingError":            {decline: &decline{"processing_error", "processing_error", "An error occurred while processing your card. Try again in a little bit."}},
	"pm_card_visa_chargeDeclinedVelocityLimitExceeded": {decline: &decline{"card_declined", "card_velocity_exceeded", "Your card was declined for making repeated attempts too frequently or exceeding its amount limit."}},

	"pm_card_authenticationRequired": {threeDS: true},
	"pm_card_threeDSecure2Required":  {threeDS: true},
	"pm_card_threeDSecureRequired":   {threeDS: true},
}

// checkPaymentMethod returns the 400 Stripe answers for a PaymentMethod id it
// does not know, or nil.
func checkPaymentMethod(id string) *apiError {
	if _, ok := testPaymentMethods[id]; ok {
		return nil
	}
	return &apiError{Type: "invalid_request_error", Code: "resource_missing", Param: "payment_method",
		Message: "No such PaymentMethod: '" + id + "'", DocURL: "https://docs.stripe.com/error-codes/resource-missing"}
}

// createParams are the parsed parameters of POST /v1/payment_intents
// (https://docs.stripe.com/api/payment_intents/create).
type createParams struct {
	amount        int64
	currency      string
	paymentMethod string
	confirm       bool
	description   *string
	captureMethod string
	returnURL     string
	pmTypes       []string
	metadata      map[string]string
	expand        []string
}

// confirmParams are the parsed parameters of POST
// /v1/payment_intents/{id}/confirm
// (https://docs.stripe.com/api/payment_intents/confirm).
type confirmParams struct {
	paymentMethod string
	returnURL     string
	expand        []string
	// declined: a FaultDecline applies (not a parameter Stripe knows).
	declined bool
}

// simpleParams are top-level create parameters accepted and ignored beyond
// validation; anything else is rejected like Stripe does (parameter_unknown).
var simpleParams = map[string]bool{
	"customer": true, "receipt_email": true, "statement_descriptor": true,
	"statement_descriptor_suffix": true, "setup_future_usage": true, "off_session": true,
	"confirmation_method": true, "error_on_requires_action": true, "use_stripe_sdk": true,
}

// confirmSimpleParams are the confirm parameters accepted and ignored.
var confirmSimpleParams = map[string]bool{
	"receipt_email": true, "setup_future_usage": true, "off_session": true,
	"error_on_requires_action": true, "use_stripe_sdk": true, "capture_method": true,
}

// nestedIgnored reports whether key is a nested parameter the emulator
// accepts and ignores.
func nestedIgnored(key string) bool {
	return strings.HasPrefix(key, "automatic_payment_methods[") ||
		strings.HasPrefix(key, "payment_method_options[") || strings.HasPrefix(key, "shipping[") ||
		strings.HasPrefix(key, "mandate_data[")
}

// parseExpand collects expand[0]=… or expand[]=… values; ok is false when
// key is not an expand parameter.
func parseExpand(key string, vals []string, into *[]string) bool {
	if key != "expand[]" && !(strings.HasPrefix(key, "expand[") && strings.HasSuffix(key, "]")) {
		return false
	}
	*into = append(*into, vals...)
	return true
}

// parseCreate decodes a form body as stripe-go encodes it: scalars, nested
// hashes as metadata[order_id], arrays as payment_method_types[0] or [].
func parseCreate(v url.Values) (createParams, *apiError) {
	p := createParams{metadata: map[string]string{}, captureMethod: "automatic"}
	type indexed struct {
		i int
		v string
	}
	var types []indexed
	for key, vals := range v {
		val := vals[len(vals)-1]
		switch {
		case key == "amount":
			n, err := parseInteger(key, val)
			if err != nil {
				return p, err
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
		case key == "return_url":
			p.returnURL = val
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
		case parseExpand(key, vals, &p.expand):
		case nestedIgnored(key) || simpleParams[key]:
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
			Message: "You cannot confirm this PaymentIntent because it's missing a payment method. To confirm the PaymentIntent with " +
				"a payment method, you must provide a payment_method parameter."}
	case p.returnURL != "" && !p.confirm:
		// https://docs.stripe.com/api/payment_intents/create#create_payment_intent-return_url:
		// "This parameter can only be used with confirm=true."
		return p, invalid("", "return_url", "The parameter return_url can only be used with confirm=true.")
	}
	if p.paymentMethod != "" {
		if err := checkPaymentMethod(p.paymentMethod); err != nil {
			return p, err
		}
	}
	return p, nil
}

// parseConfirm decodes the confirm parameters.
func parseConfirm(v url.Values) (confirmParams, *apiError) {
	var p confirmParams
	for key, vals := range v {
		val := vals[len(vals)-1]
		switch {
		case key == "payment_method":
			p.paymentMethod = val
		case key == "return_url":
			p.returnURL = val
		case parseExpand(key, vals, &p.expand):
		case nestedIgnored(key) || confirmSimpleParams[key]:
		default:
			return p, invalid("parameter_unknown", key, "Received unknown parameter: "+key)
		}
	}
	if p.paymentMethod != "" {
		if err := checkPaymentMethod(p.paymentMethod); err != nil {
			return p, err
		}
	}
	return p, nil
}

// updateParams are the parsed parameters of POST /v1/payment_intents/{id}
// (https://docs.stripe.com/api/payment_intents/update).
type updateParams struct {
	amount        *int64
	currency      string
	paymentMethod string
	description   *string
	// metadata holds the keys to set; an empty value unsets its key, and
	// clearMetadata (metadata="") unsets them all first.
	metadata      map[string]string
	clearMetadata bool
	expand        []string
}

// onlyMetadata reports whether p changes nothing but metadata and
// description, which Stripe lets a caller change in any status.
func (p updateParams) onlyMetadata() bool {
	return p.amount == nil && p.currency == "" && p.paymentMethod == ""
}

// updateIgnoredParams are the update parameters accepted and ignored
// (https://docs.stripe.com/api/payment_intents/update). Create's and
// confirm's own (confirm, return_url, off_session, confirmation_method, ...)
// are not among them: Stripe answers parameter_unknown, and so does this.
var updateIgnoredParams = map[string]bool{
	"customer": true, "receipt_email": true, "setup_future_usage": true, "statement_descriptor": true,
	"statement_descriptor_suffix": true, "application_fee_amount": true, "capture_method": true,
	"payment_method_configuration": true, "transfer_group": true,
}

// updateIgnored reports whether key is an update parameter the emulator
// accepts and ignores, nested ones included.
func updateIgnored(key string) bool {
	for _, prefix := range []string{"payment_method_types[", "payment_method_options[", "payment_method_data[", "shipping[", "transfer_data["} {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return updateIgnoredParams[key]
}

// parseUpdate decodes the update parameters the emulator applies, accepts
// the others Stripe's update takes, and refuses the rest.
func parseUpdate(v url.Values) (updateParams, *apiError) {
	p := updateParams{metadata: map[string]string{}}
	for key, vals := range v {
		val := vals[len(vals)-1]
		switch {
		case key == "amount":
			n, err := parseInteger(key, val)
			if err != nil {
				return p, err
			}
			p.amount = &n
		case key == "currency":
			p.currency = strings.ToLower(val)
		case key == "payment_method":
			if err := checkPaymentMethod(val); err != nil {
				return p, err
			}
			p.paymentMethod = val
		case key == "description":
			p.description = &val
		case key == "metadata" && val == "":
			p.clearMetadata = true
		case strings.HasPrefix(key, "metadata[") && strings.HasSuffix(key, "]"):
			p.metadata[key[len("metadata["):len(key)-1]] = val
		case parseExpand(key, vals, &p.expand):
		case updateIgnored(key):
		default:
			return p, invalid("parameter_unknown", key, "Received unknown parameter: "+key)
		}
	}
	return p, nil
}

// cancellationReasons are the accepted cancellation_reason values
// (https://docs.stripe.com/api/payment_intents/cancel).
var cancellationReasons = map[string]bool{
	"duplicate": true, "fraudulent": true, "requested_by_customer": true, "abandoned": true,
}

// parseCancel decodes the cancel parameters: the reason ("" if none) and
// expand.
func parseCancel(v url.Values) (string, []string, *apiError) {
	var reason string
	var expand []string
	for key, vals := range v {
		val := vals[len(vals)-1]
		switch {
		case key == "cancellation_reason":
			if !cancellationReasons[val] {
				return "", nil, invalid("parameter_invalid_string", key,
					"Invalid cancellation_reason: must be one of duplicate, fraudulent, requested_by_customer or abandoned")
			}
			reason = val
		case parseExpand(key, vals, &expand):
		default:
			return "", nil, invalid("parameter_unknown", key, "Received unknown parameter: "+key)
		}
	}
	return reason, expand, nil
}

// parseGet decodes the parameters of a GET by id: expand and the ignored
// client_secret.
func parseGet(v url.Values) ([]string, *apiError) {
	var expand []string
	for key, vals := range v {
		switch {
		case key == "client_secret":
		case parseExpand(key, vals, &expand):
		default:
			return nil, invalid("parameter_unknown", key, "Received unknown parameter: "+key)
		}
	}
	return expand, nil
}

// parseInteger reads an integer parameter, or answers Stripe's 400
// parameter_invalid_integer naming it.
func parseInteger(param, val string) (int64, *apiError) {
	n, err := strconv.ParseInt(val, 10, 64)
	if err != nil {
		return 0, invalid("parameter_invalid_integer", param, "Invalid integer: "+val)
	}
	return n, nil
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
