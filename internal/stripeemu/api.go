package stripeemu

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// call is one authenticated /v1 request as the endpoint handlers see it.
type call struct {
	r         *http.Request
	apiKey    string
	idemKey   string
	params    url.Values
	canonical string
	requestID string
	// declined is set, before exec runs, when a FaultDecline applies to
	// this execution (never to a roll-forward).
	declined bool
}

// response is what an endpoint decided to answer.
type response struct {
	status      int
	body        []byte
	replayed    bool
	origReq     string // Original-Request header on replays
	objID       string // the PaymentIntent or refund the request is about
	shouldRetry bool   // send Stripe-Should-Retry: true
	fault       string // name of a fault that decided the answer
	faults      execFaults
}

// endpoint validates a request and returns its execution, or the answer to
// a request that fails before executing (which stores nothing under its
// idempotency key). exec may run later than the request (a rolled-forward
// stored 500), so it must use only what it captured.
type endpoint func(c *call) (exec func() response, rejected response)

// api wraps an endpoint with what every /v1 request gets: body parsing,
// authentication, fail faults, idempotency, the request log, delays, drops
// and headers.
func (e *Emulator) api(op string, ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c := &call{r: r, idemKey: strings.TrimSpace(r.Header.Get("Idempotency-Key")), requestID: newID("req")}
		var err error
		if r.Method == http.MethodPost {
			var body []byte
			body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
			if err == nil {
				c.params, err = url.ParseQuery(string(body))
			}
		} else {
			c.params, err = url.ParseQuery(r.URL.RawQuery)
		}
		c.canonical = canonical(c.params)
		rec := Request{Method: r.Method, Path: r.URL.Path, Op: op, IdempotencyKey: c.idemKey, Params: c.canonical}

		var resp response
		apiKey, authErr := bearer(r)
		switch {
		case authErr != nil:
			resp = errResponse(http.StatusUnauthorized, authErr)
		case err != nil:
			resp = errResponse(http.StatusBadRequest, &apiError{Type: "invalid_request_error",
				Message: "Could not parse the request body as application/x-www-form-urlencoded."})
		default:
			c.apiKey = apiKey
			e.mu.Lock()
			fail, failed := take(e.faults, FaultFail, op)
			e.mu.Unlock()
			if failed {
				resp = failResponse(fail)
			} else {
				resp = e.run(c, op, ep)
			}
		}

		rec.Status, rec.Replayed, rec.Fault = resp.status, resp.replayed, resp.fault
		switch {
		case strings.HasPrefix(resp.objID, "pi_"):
			rec.PaymentIntentID = resp.objID
		case strings.HasPrefix(resp.objID, "re_"):
			rec.RefundID = resp.objID
		}
		if name := resp.faults.name(); name != "" {
			rec.Fault = name
		}
		e.mu.Lock()
		e.requests = append(e.requests, rec)
		e.mu.Unlock()
		e.logger.Info("stripe emulator: request", "method", rec.Method, "path", rec.Path, "op", op,
			"idempotency_key", rec.IdempotencyKey, "status", rec.Status, "replayed", rec.Replayed,
			"fault", rec.Fault, "object", resp.objID)

		if d := resp.faults.after; d > 0 {
			time.Sleep(d)
		}
		if resp.faults.drop {
			dropConnection(w)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Request-Id", c.requestID)
		h.Set("Stripe-Version", r.Header.Get("Stripe-Version"))
		if c.idemKey != "" && r.Method == http.MethodPost {
			h.Set("Idempotency-Key", c.idemKey)
		}
		if resp.replayed {
			h.Set("Idempotent-Replayed", "true")
			h.Set("Original-Request", resp.origReq)
		}
		if resp.shouldRetry {
			h.Set("Stripe-Should-Retry", "true")
		}
		w.WriteHeader(resp.status)
		_, _ = w.Write(resp.body)
	}
}

// run executes a request under Stripe's idempotency rules
// (https://docs.stripe.com/api/idempotent_requests): only POSTs with an
// Idempotency-Key are keyed; a key older than KeyTTL is pruned first.
func (e *Emulator) run(c *call, op string, ep endpoint) response {
	post := c.r.Method == http.MethodPost
	sc := scope{c.apiKey, c.idemKey}
	var entry *keyEntry
	if post && c.idemKey != "" {
		fingerprint := c.r.Method + " " + c.r.URL.Path + "?" + c.canonical
		e.mu.Lock()
		prev, ok := e.keys[sc]
		if ok && prev.done && !e.now().Before(prev.claimed.Add(e.keyTTL)) {
			delete(e.keys, sc) // pruned: the key runs as a new request
			ok = false
		}
		switch {
		case ok && !prev.done:
			e.mu.Unlock()
			return errResponse(http.StatusConflict, &apiError{Type: "invalid_request_error", Code: "idempotency_key_in_use",
				Message: "There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): " + c.idemKey + ". Please try again later."})
		case ok && prev.fingerprint != fingerprint:
			e.mu.Unlock()
			return errResponse(http.StatusBadRequest, &apiError{Type: "idempotency_error",
				Message: "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '" + c.idemKey + "' if you meant to execute a different request."})
		case ok:
			e.mu.Unlock()
			return response{status: prev.status, body: prev.body, replayed: true, origReq: prev.requestID, objID: objIDOf(prev.body)}
		}
		entry = &keyEntry{fingerprint: fingerprint, claimed: e.now()}
		e.keys[sc] = entry
		e.inFlight++
		e.mu.Unlock()
	}
	finish := func(r *response) {
		if entry == nil {
			return
		}
		e.mu.Lock()
		if r == nil { // not executed: Stripe saves no result, the key may be reused
			if e.keys[sc] == entry {
				delete(e.keys, sc)
			}
		} else {
			entry.done, entry.status, entry.body, entry.requestID = true, r.status, r.body, c.requestID
		}
		e.inFlight--
		e.mu.Unlock()
	}

	exec, rejected := ep(c)
	if exec == nil {
		finish(nil)
		return rejected
	}
	if post {
		e.mu.Lock()
		f, stored := take(e.faults, FaultStored500, op)
		gen := e.gen
		e.mu.Unlock()
		if stored {
			r := errResponse(http.StatusInternalServerError, &apiError{Type: "api_error",
				Message: "An unknown error occurred while processing your request (stripe emulator stored_500 fault)."})
			r.fault = string(FaultStored500)
			if f.RollForward != nil {
				if *f.RollForward == 0 {
					r.objID = exec().objID
				} else {
					e.rollForward(*f.RollForward, gen, op, exec)
				}
			}
			finish(&r)
			return r
		}
	}
	x := e.takeExecFaults(op)
	c.declined = x.decline
	if x.before > 0 {
		time.Sleep(x.before)
	}
	r := exec()
	r.faults = x
	finish(&r)
	return r
}

// rollForward executes exec d from now, unless Reset or Close comes first:
// Stripe may complete a request that answered 500 "during incident
// remediation" (https://docs.stripe.com/error-low-level#server-errors).
func (e *Emulator) rollForward(d time.Duration, gen uint64, op string, exec func() response) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		e.mu.Lock()
		_, live := e.timers[t]
		delete(e.timers, t)
		live = live && e.gen == gen && !e.closed
		if live {
			e.running.Add(1)
		}
		e.mu.Unlock()
		if !live {
			return
		}
		defer e.running.Done()
		r := exec()
		e.logger.Info("stripe emulator: stored 500 rolled forward", "op", op, "status", r.status, "object", r.objID)
	})
	e.timers[t] = struct{}{}
}

// takeExecFaults consumes the delay and drop faults for one executing request.
func (e *Emulator) takeExecFaults(op string) execFaults {
	e.mu.Lock()
	defer e.mu.Unlock()
	var x execFaults
	if f, ok := take(e.faults, FaultDelay, op); ok {
		x.before, x.after = f.Before, f.After
	}
	_, x.drop = take(e.faults, FaultDrop, op)
	if op == OpPIConfirm {
		_, x.decline = take(e.faults, FaultDecline, op)
	}
	return x
}

// dropConnection closes the client's connection without a response, as a
// network failure after the server executed the request would.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): aborting the handler resets the stream.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

// bearer returns the secret API key of the request, or the 401 error Stripe
// answers without one.
func bearer(r *http.Request) (string, *apiError) {
	auth := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		if u, _, basic := r.BasicAuth(); basic {
			key, ok = u, true
		}
	}
	key = strings.TrimSpace(key)
	switch {
	case !ok || key == "":
		return "", &apiError{Type: "invalid_request_error",
			Message: "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY')."}
	case !strings.HasPrefix(key, "sk_"):
		return "", &apiError{Type: "invalid_request_error", Code: "api_key_invalid",
			Message: "Invalid API Key provided: " + redact(key)}
	}
	return key, nil
}

// redact keeps the start of a key, as Stripe's error messages do.
func redact(key string) string {
	if len(key) <= 8 {
		return strings.Repeat("*", len(key))
	}
	return key[:8] + strings.Repeat("*", len(key)-8)
}

// unknownURL answers any other /v1 route the way Stripe does.
func (e *Emulator) unknownURL(c *call) (func() response, response) {
	return nil, errResponse(http.StatusNotFound, &apiError{Type: "invalid_request_error",
		Message: "Unrecognized request URL (" + c.r.Method + ": " + c.r.URL.Path + ")."})
}

// errResponse is a Stripe error response.
func errResponse(status int, err *apiError) response {
	return response{status: status, body: mustJSON(errorBody{Error: err})}
}

// reject is an endpoint's answer for a request that fails before executing.
func reject(status int, err *apiError) (func() response, response) {
	return nil, errResponse(status, err)
}

// failResponse is the answer of an injected FaultFail: 429 rate_limit or
// lock_timeout (https://docs.stripe.com/rate-limits), api_error otherwise
// (https://docs.stripe.com/error-low-level).
func failResponse(f Fault) response {
	var r response
	switch {
	case f.Status == http.StatusTooManyRequests && f.Code == "lock_timeout":
		r = errResponse(f.Status, &apiError{Type: "invalid_request_error", Code: "lock_timeout",
			Message: "This object cannot be accessed right now because another API request or Stripe process is currently accessing it. If you see this error intermittently, retry the request. (stripe emulator fault)"})
		r.shouldRetry = true
	case f.Status == http.StatusUnauthorized:
		// A revoked or rotated secret key (https://docs.stripe.com/keys).
		r = errResponse(f.Status, &apiError{Type: "invalid_request_error", Code: "api_key_expired",
			Message: "Expired API Key provided: sk_test_********. (stripe emulator fault)"})
	case f.Status == http.StatusForbidden:
		// A restricted key without the permission (https://docs.stripe.com/keys#limit-access).
		r = errResponse(f.Status, &apiError{Type: "invalid_request_error",
			Message: "The provided key does not have the required permissions for this endpoint. (stripe emulator fault)"})
	case f.Status == http.StatusTooManyRequests:
		r = errResponse(f.Status, &apiError{Type: "invalid_request_error", Code: "rate_limit",
			Message: "Too many requests hit the API too quickly. We recommend an exponential backoff of your requests. (stripe emulator fault)"})
	default:
		r = errResponse(f.Status, &apiError{Type: "api_error",
			Message: "An unknown error occurred (stripe emulator fault)."})
		r.shouldRetry = f.Status >= 500
	}
	r.fault = string(FaultFail)
	return r
}

// objIDOf extracts the object id from a stored body: a PaymentIntent, a
// refund, or an error carrying a PaymentIntent.
func objIDOf(body []byte) string {
	var v struct {
		ID    string `json:"id"`
		Error *struct {
			PaymentIntent *struct {
				ID string `json:"id"`
			} `json:"payment_intent"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	if v.Error != nil && v.Error.PaymentIntent != nil {
		return v.Error.PaymentIntent.ID
	}
	return v.ID
}

// mustJSON encodes v, which is always one of this package's encodable types,
// indented like Stripe's responses.
func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic("stripeemu: encode response: " + err.Error())
	}
	return append(b, '\n')
}
