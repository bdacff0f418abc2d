package stripeemu

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/stripe/stripe-go/v76"
)

// refund is the subset of Stripe's Refund object
// (https://docs.stripe.com/api/refunds/object) the emulator returns.
// Amounts are in the currency's minor unit; status is pending, succeeded or
// failed (failure_reason set).
type refund struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	BalanceTransaction *string           `json:"balance_transaction"`
	Charge             string            `json:"charge"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	FailureReason      *string           `json:"failure_reason,omitempty"`
	Metadata           map[string]string `json:"metadata"`
	PaymentIntent      string            `json:"payment_intent"`
	Reason             *string           `json:"reason"`
	ReceiptNumber      *string           `json:"receipt_number"`
	Status             string            `json:"status"`
}

// The refund statuses the emulator uses (https://docs.stripe.com/refunds#refund-statuses).
const (
	refundPending   = "pending"
	refundSucceeded = "succeeded"
	refundFailed    = "failed"
)

// storedRefund is a refund and the API key (account) that owns it.
type storedRefund struct {
	apiKey string
	r      refund
}

// refundReasons are the reasons a refund may be created with
// (https://docs.stripe.com/api/refunds/create#create_refund-reason).
var refundReasons = map[string]bool{"duplicate": true, "fraudulent": true, "requested_by_customer": true}

// refundFailureReasons are Stripe's failure_reason values
// (https://docs.stripe.com/api/refunds/object#refund_object-failure_reason).
var refundFailureReasons = map[string]bool{
	"lost_or_stolen_card": true, "expired_or_canceled_card": true, "charge_for_pending_refund_disputed": true,
	"insufficient_funds": true, "declined": true, "merchant_request": true, "unknown": true,
}

// refundParams are the parsed parameters of POST /v1/refunds.
type refundParams struct {
	paymentIntent, charge string
	amount                *int64
	reason                *string
	metadata              map[string]string
}

// parseRefund decodes POST /v1/refunds
// (https://docs.stripe.com/api/refunds/create).
func parseRefund(c *call) (refundParams, *apiError) {
	p := refundParams{metadata: map[string]string{}}
	for key, vals := range c.params {
		val := vals[len(vals)-1]
		switch {
		case key == "payment_intent":
			p.paymentIntent = val
		case key == "charge":
			p.charge = val
		case key == "amount":
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil || n < 1 {
				return p, invalid("parameter_invalid_integer", "amount", "Invalid positive integer")
			}
			p.amount = &n
		case key == "reason":
			if !refundReasons[val] {
				return p, invalid("parameter_invalid_string", "reason",
					"Invalid reason: must be one of duplicate, fraudulent, or requested_by_customer")
			}
			p.reason = &val
		case strings.HasPrefix(key, "metadata[") && strings.HasSuffix(key, "]"):
			p.metadata[key[len("metadata["):len(key)-1]] = val
		case key == "instructions_email" || key == "origin":
		case parseExpand(key, vals, new([]string)):
		default:
			return p, invalid("parameter_unknown", key, "Received unknown parameter: "+key)
		}
	}
	if p.paymentIntent == "" && p.charge == "" {
		return p, invalid("parameter_missing", "", "One of the following params should be provided for this request: payment_intent or charge.")
	}
	return p, nil
}

// createRefund serves POST /v1/refunds with Stripe's rules
// (https://docs.stripe.com/api/refunds/create, https://docs.stripe.com/refunds):
// only a succeeded payment can be refunded; several partial refunds are
// allowed, but the refunds that did not fail never add up to more than the
// amount captured ("Refund amount ($X) is greater than unrefunded amount on
// charge ($Y)", 400 with param amount), and a fully refunded charge answers
// 400 charge_already_refunded. amount defaults to what is left. A refund
// starts succeeded, or pending while SetRefundsPending(true).
func (e *Emulator) createRefund(c *call) (func() response, response) {
	p, perr := parseRefund(c)
	if perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	apiKey := c.apiKey
	return func() response {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.refundLocked(apiKey, p)
	}, response{}
}

// refundLocked creates the refund p asks for on apiKey's account, or
// answers Stripe's error; the caller holds mu. POST /v1/refunds and the
// Dashboard's refund (DashboardRefund) both end here.
func (e *Emulator) refundLocked(apiKey string, p refundParams) response {
	s, ch, bad := e.refundTargetLocked(apiKey, p)
	if bad != nil {
		return *bad
	}
	left := ch.AmountCaptured - ch.AmountRefunded
	if left <= 0 {
		return errResponse(http.StatusBadRequest, &apiError{Type: "invalid_request_error", Code: "charge_already_refunded",
			Message: "Charge " + ch.ID + " has already been refunded.", DocURL: docURL("charge_already_refunded")})
	}
	amount := left
	if p.amount != nil {
		amount = *p.amount
	}
	if amount > left {
		// Observed at Stripe: no code, param amount.
		return errResponse(http.StatusBadRequest, &apiError{Type: "invalid_request_error", Param: "amount",
			Message: fmt.Sprintf("Refund amount (%s) is greater than unrefunded amount on charge (%s)",
				money(amount, ch.Currency), money(left, ch.Currency))})
	}
	status := refundSucceeded
	if e.refundsPending {
		status = refundPending
	}
	rf := &storedRefund{apiKey: apiKey, r: refund{ID: newID("re"), Object: "refund", Amount: amount, Charge: ch.ID,
		Created: e.now().Unix(), Currency: ch.Currency, Metadata: p.metadata, PaymentIntent: s.pi.ID,
		Reason: p.reason, Status: status}}
	e.refunds[rf.r.ID] = rf
	e.refundOrder = append(e.refundOrder, rf)
	ch.AmountRefunded += amount
	ch.Refunded = ch.AmountRefunded == ch.AmountCaptured
	e.emitLocked("refund.created", compactJSON(rf.r))
	e.emitLocked("charge.refunded", compactJSON(ch))
	return response{status: http.StatusOK, body: mustJSON(rf.r), objID: rf.r.ID}
}

// refundTargetLocked finds the PaymentIntent and charge a refund is for, or
// the error Stripe answers; the caller holds mu.
func (e *Emulator) refundTargetLocked(apiKey string, p refundParams) (*storedIntent, *charge, *response) {
	fail := func(r response) (*storedIntent, *charge, *response) { return nil, nil, &r }
	var s *storedIntent
	var ch *charge
	if p.paymentIntent != "" {
		var ok bool
		if s, ok = e.intents[p.paymentIntent]; !ok || s.apiKey != apiKey {
			return fail(errResponse(http.StatusBadRequest, &apiError{Type: "invalid_request_error", Code: "resource_missing",
				Param: "payment_intent", Message: "No such payment_intent: '" + p.paymentIntent + "'", DocURL: docURL("resource_missing")}))
		}
		ch = e.charges[s.pi.LatestCharge.id]
	}
	if p.charge != "" {
		var ok bool
		if ch, ok = e.charges[p.charge]; !ok || ch.apiKey != apiKey {
			return fail(errResponse(http.StatusBadRequest, &apiError{Type: "invalid_request_error", Code: "resource_missing",
				Param: "charge", Message: "No such charge: '" + p.charge + "'", DocURL: docURL("resource_missing")}))
		}
		if s != nil && s.pi.ID != ch.PaymentIntent {
			return fail(errResponse(http.StatusBadRequest, invalid("", "charge", "The charge "+ch.ID+" does not belong to "+s.pi.ID+".")))
		}
		s = e.intents[ch.PaymentIntent]
	}
	if s.pi.Status != statusSucceeded || ch == nil || !ch.Captured {
		return fail(errResponse(http.StatusBadRequest, &apiError{Type: "invalid_request_error", Param: "payment_intent",
			Message: "This PaymentIntent (" + s.pi.ID + ") does not have a successful charge to refund."}))
	}
	return s, ch, nil
}

// money formats a minor-unit amount the way Stripe's refund messages do:
// "$25.00", "€9.50", "¥500", else "12.34 SEK".
func money(amount int64, currency string) string {
	zeroDecimal := slices.Contains([]string{"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf",
		"ugx", "vnd", "vuv", "xaf", "xof", "xpf"}, currency) // https://docs.stripe.com/currencies#zero-decimal
	n := strconv.FormatInt(amount, 10)
	if !zeroDecimal {
		n = fmt.Sprintf("%d.%02d", amount/100, amount%100)
	}
	switch currency {
	case "usd":
		return "$" + n
	case "eur":
		return "€" + n
	case "gbp":
		return "£" + n
	case "jpy":
		return "¥" + n
	}
	return n + " " + strings.ToUpper(currency)
}

// retrieveRefund serves GET /v1/refunds/{id}
// (https://docs.stripe.com/api/refunds/retrieve).
func (e *Emulator) retrieveRefund(c *call) (func() response, response) {
	if _, perr := parseGet(c.params); perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	apiKey, id := c.apiKey, c.r.PathValue("id")
	return func() response {
		e.mu.Lock()
		defer e.mu.Unlock()
		rf, ok := e.refunds[id]
		if !ok || rf.apiKey != apiKey {
			return e.missingRefund(id)
		}
		return response{status: http.StatusOK, body: mustJSON(rf.r), objID: id}
	}, response{}
}

// missingRefund is Stripe's 404 for an unknown refund id.
func (e *Emulator) missingRefund(id string) response {
	return errResponse(http.StatusNotFound, &apiError{Type: "invalid_request_error", Code: "resource_missing",
		Param: "id", Message: "No such refund: '" + id + "'", DocURL: docURL("resource_missing")})
}

// listRefunds serves GET /v1/refunds
// (https://docs.stripe.com/api/refunds/list): the account's refunds, newest
// first, filtered by payment_intent or charge, never lagged.
func (e *Emulator) listRefunds(c *call) (func() response, response) {
	p, perr := parseList(c.params, "payment_intent", "charge", "created", "created[")
	if perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	apiKey := c.apiKey
	return func() response {
		e.mu.Lock()
		defer e.mu.Unlock()
		var ids []string
		for _, rf := range slices.Backward(e.refundOrder) {
			if rf.apiKey != apiKey || !matchesCreated(rf.r.Created, p.filters) {
				continue
			}
			if pi := p.filters["payment_intent"]; pi != "" && rf.r.PaymentIntent != pi {
				continue
			}
			if ch := p.filters["charge"]; ch != "" && rf.r.Charge != ch {
				continue
			}
			ids = append(ids, rf.r.ID)
		}
		got, hasMore, bad := page(ids, p, e.missingRefund)
		if bad != nil {
			return *bad
		}
		data := make([]refund, 0, len(got))
		for _, id := range got {
			data = append(data, e.refunds[id].r)
		}
		return response{status: http.StatusOK, body: mustJSON(listBody{Object: "list", Data: data, HasMore: hasMore, URL: "/v1/refunds"})}
	}, response{}
}

// SetRefundsPending makes new refunds start pending (true) until
// SucceedRefund or FailRefund, or succeeded at once (false, the default), as
// card refunds usually do (https://docs.stripe.com/refunds#refund-statuses).
func (e *Emulator) SetRefundsPending(on bool) {
	e.mu.Lock()
	e.refundsPending = on
	e.mu.Unlock()
}

// SucceedRefund moves a pending refund to succeeded and returns its JSON;
// ErrNotFound, or ErrWrongState when it is not pending.
func (e *Emulator) SucceedRefund(id string) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rf, ok := e.refunds[id]
	if !ok {
		return nil, ErrNotFound
	}
	if rf.r.Status != refundPending {
		return nil, fmt.Errorf("%w: refund %s is %s, not pending", ErrWrongState, id, rf.r.Status)
	}
	rf.r.Status = refundSucceeded
	e.emitLocked("refund.updated", compactJSON(rf.r))
	return mustJSON(rf.r), nil
}

// FailRefund fails a pending or succeeded refund, as Stripe may later
// ("a refund can fail ... after it's been marked as succeeded",
// https://docs.stripe.com/refunds#failed-refunds): status failed,
// failure_reason set (default expired_or_canceled_card), and its amount is
// refundable again (the charge's amount_refunded drops). It returns the
// refund's JSON; ErrNotFound, ErrWrongState when already failed, or an
// error for an unknown reason.
func (e *Emulator) FailRefund(id, reason string) ([]byte, error) {
	if reason == "" {
		reason = "expired_or_canceled_card"
	}
	if !refundFailureReasons[reason] {
		return nil, fmt.Errorf("failure_reason %q: want one of Stripe's (declined, expired_or_canceled_card, …)", reason)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	rf, ok := e.refunds[id]
	if !ok {
		return nil, ErrNotFound
	}
	if rf.r.Status == refundFailed {
		return nil, fmt.Errorf("%w: refund %s already failed", ErrWrongState, id)
	}
	rf.r.Status, rf.r.FailureReason = refundFailed, &reason
	if ch, ok := e.charges[rf.r.Charge]; ok {
		ch.AmountRefunded -= rf.r.Amount
		ch.Refunded = false
	}
	e.emitLocked("refund.updated", compactJSON(rf.r))
	e.emitLocked("refund.failed", compactJSON(rf.r))
	return mustJSON(rf.r), nil
}

// Refunds returns every refund of every account, in creation order, as
// stripe-go v76 decodes the emulator's JSON.
func (e *Emulator) Refunds() []*stripe.Refund {
	e.mu.Lock()
	raw := make([][]byte, 0, len(e.refundOrder))
	for _, rf := range e.refundOrder {
		raw = append(raw, compactJSON(rf.r))
	}
	e.mu.Unlock()
	out := make([]*stripe.Refund, 0, len(raw))
	for _, b := range raw {
		var r stripe.Refund
		if err := json.Unmarshal(b, &r); err != nil {
			panic("stripeemu: decode own refund: " + err.Error())
		}
		out = append(out, &r)
	}
	return out
}

// postRefundsPending serves POST /_emulator/refunds/pending {"on":bool}: 204.
func (e *Emulator) postRefundsPending(w http.ResponseWriter, r *http.Request) {
	var in struct {
		On *bool `json:"on"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil || in.On == nil {
		writeAdminError(w, http.StatusBadRequest, fmt.Errorf(`want {"on":true|false}`))
		return
	}
	e.SetRefundsPending(*in.On)
	e.logger.Info("stripe emulator: refunds pending", "on", *in.On)
	w.WriteHeader(http.StatusNoContent)
}

// postRefundSucceed serves POST /_emulator/refunds/{id}/succeed: 200 with the
// refund; 404 unknown; 409 not pending.
func (e *Emulator) postRefundSucceed(w http.ResponseWriter, r *http.Request) {
	body, err := e.SucceedRefund(r.PathValue("id"))
	if err != nil {
		writeControlError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// postRefundFail serves POST /_emulator/refunds/{id}/fail with an optional
// body {"failure_reason":"declined"}: 200 with the refund; 400 unknown
// reason; 404 unknown refund; 409 already failed.
func (e *Emulator) postRefundFail(w http.ResponseWriter, r *http.Request) {
	var in struct {
		FailureReason string `json:"failure_reason"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil {
			writeAdminError(w, http.StatusBadRequest, err)
			return
		}
	}
	body, err := e.FailRefund(r.PathValue("id"), in.FailureReason)
	if err != nil {
		writeControlError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
