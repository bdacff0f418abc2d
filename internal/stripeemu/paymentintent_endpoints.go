package stripeemu

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// charge is the subset of Stripe's Charge object
// (https://docs.stripe.com/api/charges/object) behind a PaymentIntent's
// latest_charge. amount_refunded follows the refunds that did not fail.
type charge struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountCaptured int64             `json:"amount_captured"`
	AmountRefunded int64             `json:"amount_refunded"`
	Captured       bool              `json:"captured"`
	Created        int64             `json:"created"`
	Currency       string            `json:"currency"`
	FailureCode    *string           `json:"failure_code"`
	FailureMessage *string           `json:"failure_message"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Paid           bool              `json:"paid"`
	PaymentIntent  string            `json:"payment_intent"`
	PaymentMethod  string            `json:"payment_method"`
	Refunded       bool              `json:"refunded"`
	Status         string            `json:"status"`

	apiKey string
}

// createPaymentIntent serves POST /v1/payment_intents
// (https://docs.stripe.com/api/payment_intents/create): with confirm=true it
// also confirms, answering 402 card_error with the PaymentIntent for a
// decline.
func (e *Emulator) createPaymentIntent(c *call) (func() response, response) {
	p, perr := parseCreate(c.params)
	if perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	apiKey, idemKey := c.apiKey, c.idemKey
	return func() response {
		e.mu.Lock()
		defer e.mu.Unlock()
		id := newID("pi")
		s := &storedIntent{apiKey: apiKey, createdAt: e.now(), pi: paymentIntent{
			ID: id, Object: "payment_intent", Amount: p.amount, CaptureMethod: p.captureMethod,
			ClientSecret: id + "_secret_" + newID("s")[2:], ConfirmationMethod: "automatic",
			Created: e.now().Unix(), Currency: p.currency, Description: p.description,
			Metadata: p.metadata, PaymentMethodTypes: p.pmTypes, Status: statusRequiresPaymentMethod,
		}}
		if p.paymentMethod != "" {
			s.pi.PaymentMethod = &p.paymentMethod
			s.pi.Status = statusRequiresConfirmation
		}
		e.intents[id] = s
		e.intentOrder = append(e.intentOrder, s)
		e.created++
		if idemKey != "" {
			e.createdByKey[idemKey]++
		}
		e.emitPILocked("payment_intent.created", s)
		if p.confirm {
			return e.confirmLocked(s, confirmParams{returnURL: p.returnURL, expand: p.expand})
		}
		return e.piResponse(s, p.expand)
	}, response{}
}

// confirmPaymentIntent serves POST /v1/payment_intents/{id}/confirm
// (https://docs.stripe.com/api/payment_intents/confirm).
func (e *Emulator) confirmPaymentIntent(c *call) (func() response, response) {
	p, perr := parseConfirm(c.params)
	if perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	return e.onIntent(c, func(s *storedIntent) response {
		q := p
		q.declined = c.declined // read at execution: a roll-forward runs without it
		return e.confirmLocked(s, q)
	}), response{}
}

// confirmLocked confirms s; the caller holds mu. Stripe confirms only a
// PaymentIntent in requires_payment_method, requires_confirmation or
// requires_action; any other status is a 400 payment_intent_unexpected_state
// (https://docs.stripe.com/error-codes#payment-intent-unexpected-state).
func (e *Emulator) confirmLocked(s *storedIntent, p confirmParams) response {
	switch s.pi.Status {
	case statusRequiresPaymentMethod, statusRequiresConfirmation, statusRequiresAction:
	case statusSucceeded:
		return e.unexpectedState(s, "You cannot confirm this PaymentIntent because it has already succeeded after being previously confirmed.")
	default:
		return e.unexpectedState(s, "You cannot confirm this PaymentIntent because it has a status of "+s.pi.Status+
			". Only a PaymentIntent with one of the following statuses may be confirmed: requires_confirmation, requires_payment_method, requires_action.")
	}
	if p.paymentMethod != "" {
		pm := p.paymentMethod
		s.pi.PaymentMethod = &pm
	}
	if s.pi.PaymentMethod == nil {
		return e.unexpectedState(s, "You cannot confirm this PaymentIntent because it's missing a payment method. To confirm the "+
			"PaymentIntent with a payment method, you must provide a payment_method parameter.")
	}
	card := testPaymentMethods[*s.pi.PaymentMethod]
	if p.declined {
		card = testPaymentMethods["pm_card_chargeDeclined"]
	}
	s.pi.LastPaymentError, s.pi.NextAction = nil, nil
	switch {
	case card.decline != nil:
		d := card.decline
		ch := e.newChargeLocked(s, "failed")
		ch.FailureCode, ch.FailureMessage = &d.code, &d.message
		s.pi.Status = statusRequiresPaymentMethod
		s.pi.LastPaymentError = &apiError{Type: "card_error", Code: d.code, DeclineCode: d.declineCode,
			Message: d.message, Charge: ch.ID, DocURL: docURL(d.code)}
		e.emitPILocked("payment_intent.payment_failed", s)
		pi := e.renderPILocked(s, p.expand)
		return errResponse(http.StatusPaymentRequired, &apiError{Type: "card_error", Code: d.code, DeclineCode: d.declineCode,
			Message: d.message, Charge: ch.ID, DocURL: docURL(d.code), PaymentIntent: &pi})
	case card.threeDS:
		// https://docs.stripe.com/testing#regulatory-cards: "This card requires
		// authentication for every payment"; the PaymentIntent waits in
		// requires_action with a next_action (https://docs.stripe.com/payments/3d-secure/authentication-flow).
		s.pi.Status = statusRequiresAction
		s.returnURL = p.returnURL
		if p.returnURL != "" {
			s.pi.NextAction = &nextAction{Type: "redirect_to_url", RedirectToURL: &redirectToURL{
				URL: e.redirectURL(s), ReturnURL: p.returnURL}}
		} else {
			s.pi.NextAction = &nextAction{Type: "use_stripe_sdk", UseStripeSDK: &useStripeSDK{
				Type: "three_d_secure_redirect", ThreeDSSource: newID("payatt")}}
		}
		e.emitPILocked("payment_intent.requires_action", s)
	default:
		e.succeedLocked(s)
	}
	return e.piResponse(s, p.expand)
}

// succeedLocked charges s's card: succeeded, or requires_capture for manual
// capture (https://docs.stripe.com/payments/paymentintents/lifecycle).
func (e *Emulator) succeedLocked(s *storedIntent) {
	ch := e.newChargeLocked(s, "succeeded")
	ch.Paid = true
	if s.pi.CaptureMethod == "manual" {
		s.pi.Status = statusRequiresCapture
		s.pi.AmountCapturable = s.pi.Amount
		e.emitPILocked("payment_intent.amount_capturable_updated", s)
		return
	}
	ch.Captured, ch.AmountCaptured = true, s.pi.Amount
	s.pi.Status = statusSucceeded
	s.pi.AmountReceived = s.pi.Amount
	e.emitPILocked("payment_intent.succeeded", s)
}

// newChargeLocked records a charge for s and makes it s's latest_charge.
func (e *Emulator) newChargeLocked(s *storedIntent, status string) *charge {
	ch := &charge{ID: newID("ch"), Object: "charge", Amount: s.pi.Amount, Created: e.now().Unix(),
		Currency: s.pi.Currency, Metadata: s.pi.Metadata, PaymentIntent: s.pi.ID,
		PaymentMethod: deref(s.pi.PaymentMethod), Status: status, apiKey: s.apiKey}
	e.charges[ch.ID] = ch
	s.pi.LatestCharge = expandable{id: ch.ID}
	return ch
}

// cancelPaymentIntent serves POST /v1/payment_intents/{id}/cancel
// (https://docs.stripe.com/api/payment_intents/cancel): "You can cancel a
// PaymentIntent object when it's in one of these statuses:
// requires_payment_method, requires_capture, requires_confirmation,
// requires_action or, in rare cases, processing." Any other status, a
// succeeded PaymentIntent included, is a 400 payment_intent_unexpected_state.
func (e *Emulator) cancelPaymentIntent(c *call) (func() response, response) {
	reason, expand, perr := parseCancel(c.params)
	if perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	return e.onIntent(c, func(s *storedIntent) response {
		switch s.pi.Status {
		case statusRequiresPaymentMethod, statusRequiresCapture, statusRequiresConfirmation, statusRequiresAction, statusProcessing:
		default:
			return e.unexpectedState(s, "You cannot cancel this PaymentIntent because it has a status of "+s.pi.Status+
				". Only a PaymentIntent with one of the following statuses may be canceled: requires_payment_method, "+
				"requires_capture, requires_confirmation, requires_action, processing.")
		}
		e.cancelLocked(s, reason)
		return e.piResponse(s, expand)
	}), response{}
}

// updatePaymentIntent serves POST /v1/payment_intents/{id}
// (https://docs.stripe.com/api/payment_intents/update): it changes the
// PaymentIntent without confirming it. "Updating the payment_method always
// requires you to confirm the PaymentIntent again": one waiting for a
// payment method or for its next action moves to requires_confirmation.
// Metadata and description can be changed in any status; anything else
// only in requires_payment_method, requires_confirmation or
// requires_action (400 payment_intent_unexpected_state). No event is sent:
// Stripe has no payment_intent.updated.
func (e *Emulator) updatePaymentIntent(c *call) (func() response, response) {
	p, perr := parseUpdate(c.params)
	if perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	return e.onIntent(c, func(s *storedIntent) response {
		switch s.pi.Status {
		case statusRequiresPaymentMethod, statusRequiresConfirmation, statusRequiresAction:
		default:
			if !p.onlyMetadata() {
				return e.unexpectedState(s, "You cannot update this PaymentIntent because it has a status of "+s.pi.Status+
					". You may only update a PaymentIntent with one of the following statuses: requires_payment_method, "+
					"requires_confirmation, requires_action.")
			}
		}
		if p.clearMetadata {
			s.pi.Metadata = map[string]string{}
		}
		for k, v := range p.metadata {
			if v == "" {
				delete(s.pi.Metadata, k)
				continue
			}
			if s.pi.Metadata == nil {
				s.pi.Metadata = map[string]string{}
			}
			s.pi.Metadata[k] = v
		}
		if p.description != nil {
			s.pi.Description = p.description
		}
		if p.amount != nil {
			s.pi.Amount = *p.amount
		}
		if p.currency != "" {
			s.pi.Currency = p.currency
		}
		if p.paymentMethod != "" {
			pm := p.paymentMethod
			s.pi.PaymentMethod = &pm
			s.pi.Status, s.pi.NextAction = statusRequiresConfirmation, nil
		}
		return e.piResponse(s, p.expand)
	}), response{}
}

// retrievePaymentIntent serves GET /v1/payment_intents/{id}
// (https://docs.stripe.com/api/payment_intents/retrieve); another API key's
// PaymentIntent is a 404, as another account's is on Stripe.
func (e *Emulator) retrievePaymentIntent(c *call) (func() response, response) {
	expand, perr := parseGet(c.params)
	if perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	return e.onIntent(c, func(s *storedIntent) response {
		return e.piResponse(s, expand)
	}), response{}
}

// retrieveCharge serves GET /v1/charges/{id}
// (https://docs.stripe.com/api/charges/retrieve).
func (e *Emulator) retrieveCharge(c *call) (func() response, response) {
	if _, perr := parseGet(c.params); perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	apiKey, id := c.apiKey, c.r.PathValue("id")
	return func() response {
		e.mu.Lock()
		defer e.mu.Unlock()
		ch, ok := e.charges[id]
		if !ok || ch.apiKey != apiKey {
			return errResponse(http.StatusNotFound, &apiError{Type: "invalid_request_error", Code: "resource_missing",
				Param: "id", Message: "No such charge: '" + id + "'", DocURL: docURL("resource_missing")})
		}
		return response{status: http.StatusOK, body: mustJSON(ch), objID: ch.PaymentIntent}
	}, response{}
}

// listParams are the pagination parameters of a list
// (https://docs.stripe.com/api/pagination).
type listParams struct {
	limit                       int
	startingAfter, endingBefore string
	filters                     map[string]string // other accepted filters, by name
}

// parseList decodes limit, starting_after, ending_before and expand, and
// the filters named in allowed (exact names or prefixes ending in "[").
func parseList(v url.Values, allowed ...string) (listParams, *apiError) {
	p := listParams{limit: 10, filters: map[string]string{}}
	var expand []string
	for key, vals := range v {
		val := vals[len(vals)-1]
		switch {
		case key == "limit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > 100 {
				return p, invalid("parameter_invalid_integer", "limit",
					"Invalid limit: must be an integer between 1 and 100")
			}
			p.limit = n
		case key == "starting_after":
			p.startingAfter = val
		case key == "ending_before":
			p.endingBefore = val
		case parseExpand(key, vals, &expand):
		case slices.ContainsFunc(allowed, func(a string) bool { return a == key || strings.HasSuffix(a, "[") && strings.HasPrefix(key, a) }):
			p.filters[key] = val
		default:
			return p, invalid("parameter_unknown", key, "Received unknown parameter: "+key)
		}
	}
	return p, nil
}

// page applies a cursor and limit to ids, newest first; missing is the 400
// for a cursor that names no object in ids.
func page(ids []string, p listParams, missing func(id string) response) ([]string, bool, *response) {
	from, to := 0, len(ids)
	if p.startingAfter != "" {
		i := slices.Index(ids, p.startingAfter)
		if i < 0 {
			r := missing(p.startingAfter)
			return nil, false, &r
		}
		from = i + 1
	}
	if p.endingBefore != "" {
		i := slices.Index(ids, p.endingBefore)
		if i < 0 {
			r := missing(p.endingBefore)
			return nil, false, &r
		}
		to = i
		from = max(from, to-p.limit)
	}
	if from > to {
		from = to
	}
	out := ids[from:to]
	hasMore := len(out) > p.limit
	if p.endingBefore != "" {
		hasMore = from > 0
	}
	if len(out) > p.limit {
		out = out[:p.limit]
	}
	return out, hasMore, nil
}

// listPaymentIntents serves GET /v1/payment_intents
// (https://docs.stripe.com/api/payment_intents/list): the account's
// PaymentIntents, newest first, never lagged. Filters: customer (the
// emulator has no customers, so it matches nothing) and created[gt|gte|lt|lte]
// or created=<unix>.
func (e *Emulator) listPaymentIntents(c *call) (func() response, response) {
	p, perr := parseList(c.params, "customer", "created", "created[")
	if perr != nil {
		return reject(http.StatusBadRequest, perr)
	}
	for k, v := range p.filters {
		if strings.HasPrefix(k, "created") {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return reject(http.StatusBadRequest, invalid("parameter_invalid_integer", k, "Invalid integer: "+v))
			}
		}
	}
	apiKey := c.apiKey
	return func() response {
		e.mu.Lock()
		defer e.mu.Unlock()
		var ids []string
		for _, s := range slices.Backward(e.intentOrder) {
			if s.apiKey == apiKey && matchesCreated(s.pi.Created, p.filters) && p.filters["customer"] == "" {
				ids = append(ids, s.pi.ID)
			}
		}
		got, hasMore, bad := page(ids, p, func(id string) response { return e.missingIntent(id) })
		if bad != nil {
			return *bad
		}
		data := make([]paymentIntent, 0, len(got))
		for _, id := range got {
			data = append(data, e.renderPILocked(e.intents[id], nil))
		}
		return response{status: http.StatusOK, body: mustJSON(listBody{Object: "list", Data: data, HasMore: hasMore, URL: "/v1/payment_intents"})}
	}, response{}
}

// matchesCreated applies the created filters to a Unix time.
func matchesCreated(created int64, filters map[string]string) bool {
	for k, v := range filters {
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "created":
			if created != n {
				return false
			}
		case "created[gt]":
			if created <= n {
				return false
			}
		case "created[gte]":
			if created < n {
				return false
			}
		case "created[lt]":
			if created >= n {
				return false
			}
		case "created[lte]":
			if created > n {
				return false
			}
		}
	}
	return true
}

// listBody is Stripe's list envelope.
type listBody struct {
	Object  string `json:"object"`
	Data    any    `json:"data"`
	HasMore bool   `json:"has_more"`
	URL     string `json:"url"`
}

// searchBody is Stripe's search envelope
// (https://docs.stripe.com/api/pagination/search).
type searchBody struct {
	Object   string  `json:"object"`
	Data     any     `json:"data"`
	HasMore  bool    `json:"has_more"`
	NextPage *string `json:"next_page"`
	URL      string  `json:"url"`
}

// searchPaymentIntents serves GET /v1/payment_intents/search
// (https://docs.stripe.com/api/payment_intents/search) for the query
// language subset in parseSearchQuery. An object appears only SearchLag
// after it was created (https://docs.stripe.com/search#data-freshness);
// then it is returned as it is now. Newest first; page is the next_page
// token of the previous page.
func (e *Emulator) searchPaymentIntents(c *call) (func() response, response) {
	var (
		query string
		limit = 10
		from  int
	)
	for key, vals := range c.params {
		val := vals[len(vals)-1]
		switch {
		case key == "query":
			query = val
		case key == "limit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > 100 {
				return reject(http.StatusBadRequest, invalid("parameter_invalid_integer", "limit", "Invalid limit: must be an integer between 1 and 100"))
			}
			limit = n
		case key == "page":
			n, err := strconv.Atoi(strings.TrimPrefix(val, "page_"))
			if err != nil || n < 0 || !strings.HasPrefix(val, "page_") {
				return reject(http.StatusBadRequest, invalid("", "page", "Invalid page token: "+val))
			}
			from = n
		case parseExpand(key, vals, new([]string)):
		default:
			return reject(http.StatusBadRequest, invalid("parameter_unknown", key, "Received unknown parameter: "+key))
		}
	}
	if query == "" {
		return reject(http.StatusBadRequest, invalid("parameter_missing", "query", "Missing required param: query."))
	}
	q, qerr := parseSearchQuery(query)
	if qerr != nil {
		return reject(http.StatusBadRequest, qerr)
	}
	apiKey := c.apiKey
	return func() response {
		e.mu.Lock()
		defer e.mu.Unlock()
		now := e.now()
		var hits []paymentIntent
		for _, s := range slices.Backward(e.intentOrder) {
			if s.apiKey == apiKey && !now.Before(s.createdAt.Add(e.searchLag)) && q.matches(&s.pi) {
				hits = append(hits, e.renderPILocked(s, nil))
			}
		}
		from := min(from, len(hits))
		to := min(from+limit, len(hits))
		body := searchBody{Object: "search_result", Data: hits[from:to], HasMore: to < len(hits), URL: "/v1/payment_intents/search"}
		if body.HasMore {
			next := "page_" + strconv.Itoa(to)
			body.NextPage = &next
		}
		return response{status: http.StatusOK, body: mustJSON(body)}
	}, response{}
}

// searchQuery is a parsed search query: clauses joined by AND, or by OR.
type searchQuery struct {
	clauses []searchClause
	or      bool
}

// searchClause is field:value, with key set for metadata['key'].
type searchClause struct {
	field, key, value string
}

// parseSearchQuery parses the subset of Stripe's search query language
// (https://docs.stripe.com/search#search-query-language) the emulator
// supports: exact matches field:'value' (or "value", or a bare number) on
// metadata['key'], status, currency, amount and customer, joined by AND or
// by OR (Stripe does not allow mixing them). Anything else is a 400.
func parseSearchQuery(q string) (searchQuery, *apiError) {
	bad := func(msg string) (searchQuery, *apiError) {
		return searchQuery{}, invalid("", "query", "Invalid search query "+strconv.Quote(q)+": "+msg)
	}
	var out searchQuery
	seenAnd, seenOr := false, false
	rest := strings.TrimSpace(q)
	for {
		colon := strings.IndexByte(rest, ':')
		if colon <= 0 {
			return bad("expected field:value")
		}
		field := strings.TrimSpace(rest[:colon])
		rest = rest[colon+1:]
		cl := searchClause{field: field}
		if k, ok := strings.CutPrefix(field, "metadata["); ok && strings.HasSuffix(k, "]") {
			k = k[:len(k)-1]
			if len(k) < 2 || (k[0] != '\'' && k[0] != '"') || k[len(k)-1] != k[0] {
				return bad("metadata key must be quoted, as metadata['order_id']")
			}
			cl.field, cl.key = "metadata", k[1:len(k)-1]
		} else if !slices.Contains([]string{"status", "currency", "amount", "customer"}, field) {
			return bad("unsupported field " + strconv.Quote(field))
		}
		if rest == "" {
			return bad("missing value")
		}
		if quote := rest[0]; quote == '\'' || quote == '"' {
			end := strings.IndexByte(rest[1:], quote)
			if end < 0 {
				return bad("unterminated string")
			}
			cl.value, rest = rest[1:1+end], rest[2+end:]
		} else {
			end := strings.IndexByte(rest, ' ')
			if end < 0 {
				end = len(rest)
			}
			cl.value, rest = rest[:end], rest[end:]
			if _, err := strconv.ParseInt(cl.value, 10, 64); err != nil {
				return bad("string values must be quoted")
			}
		}
		out.clauses = append(out.clauses, cl)
		rest = strings.TrimSpace(rest)
		if rest == "" {
			break
		}
		switch {
		case strings.HasPrefix(rest, "AND "):
			seenAnd, rest = true, rest[4:]
		case strings.HasPrefix(rest, "OR "):
			seenOr, rest = true, rest[3:]
		default:
			return bad("expected AND or OR between clauses")
		}
		if seenAnd && seenOr {
			return bad("AND and OR cannot be combined")
		}
		rest = strings.TrimSpace(rest)
	}
	out.or = seenOr
	return out, nil
}

// matches reports whether pi satisfies the query.
func (q searchQuery) matches(pi *paymentIntent) bool {
	for _, c := range q.clauses {
		var ok bool
		switch c.field {
		case "metadata":
			v, has := pi.Metadata[c.key]
			ok = has && v == c.value
		case "status":
			ok = pi.Status == c.value
		case "currency":
			ok = pi.Currency == strings.ToLower(c.value)
		case "amount":
			ok = strconv.FormatInt(pi.Amount, 10) == c.value
		case "customer":
			ok = false // the emulator has no customers
		}
		if ok && q.or {
			return true
		}
		if !ok && !q.or {
			return false
		}
	}
	return !q.or
}

// intentLocked returns the account's PaymentIntent, or nil and the 404 Stripe
// answers; the caller holds mu.
func (e *Emulator) intentLocked(apiKey, id string) (*storedIntent, response) {
	s, ok := e.intents[id]
	if !ok || s.apiKey != apiKey {
		return nil, e.missingIntent(id)
	}
	return s, response{}
}

// onIntent returns the execution of call c on the PaymentIntent its path
// names ({id}): fn runs under mu with it. Another API key's PaymentIntent
// is a 404, as another account's is on Stripe, and so is an unknown id.
func (e *Emulator) onIntent(c *call, fn func(s *storedIntent) response) func() response {
	apiKey, id := c.apiKey, c.r.PathValue("id")
	return func() response {
		e.mu.Lock()
		defer e.mu.Unlock()
		s, missing := e.intentLocked(apiKey, id)
		if s == nil {
			return missing
		}
		return fn(s)
	}
}

// missingIntent is Stripe's 404 for an unknown PaymentIntent id.
func (e *Emulator) missingIntent(id string) response {
	return errResponse(http.StatusNotFound, &apiError{Type: "invalid_request_error", Code: "resource_missing",
		Param: "intent", Message: "No such payment_intent: '" + id + "'", DocURL: docURL("resource_missing")})
}

// unexpectedState is the 400 payment_intent_unexpected_state, carrying the
// PaymentIntent as Stripe's error does.
func (e *Emulator) unexpectedState(s *storedIntent, msg string) response {
	pi := e.renderPILocked(s, nil)
	r := errResponse(http.StatusBadRequest, &apiError{Type: "invalid_request_error", Code: "payment_intent_unexpected_state",
		Message: msg, DocURL: docURL("payment_intent_unexpected_state"), PaymentIntent: &pi})
	r.objID = s.pi.ID
	return r
}

// piResponse is 200 with s as JSON.
func (e *Emulator) piResponse(s *storedIntent, expand []string) response {
	return response{status: http.StatusOK, body: mustJSON(e.renderPILocked(s, expand)), objID: s.pi.ID}
}

// renderPILocked returns a copy of s's PaymentIntent with the requested
// fields expanded (latest_charge; other names are ignored).
func (e *Emulator) renderPILocked(s *storedIntent, expand []string) paymentIntent {
	pi := s.pi
	if slices.Contains(expand, "latest_charge") && pi.LatestCharge.id != "" {
		ch := *e.charges[pi.LatestCharge.id]
		pi.LatestCharge.obj = ch
	}
	return pi
}

// emitPILocked records the event typ for s's current state.
func (e *Emulator) emitPILocked(typ string, s *storedIntent) {
	e.emitLocked(typ, compactJSON(e.renderPILocked(s, nil)))
}

// docURL is Stripe's documentation link for an error code.
func docURL(code string) string {
	return "https://docs.stripe.com/error-codes/" + strings.ReplaceAll(code, "_", "-")
}

// deref returns *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
