// Package stripeemu is a stateful, in-memory emulator of Stripe's
// PaymentIntents API over real HTTP, for tests and the local stack.
//
// It follows Stripe's idempotency rules
// (https://docs.stripe.com/api/idempotent_requests), scoped per API key:
//   - the same Idempotency-Key with the same parameters replays the stored
//     response byte for byte, with the header Idempotent-Replayed: true;
//   - the same key with other parameters (or another endpoint) is a 400
//     idempotency_error;
//   - the same key while the first request with it still executes is a 409
//     with code idempotency_key_in_use;
//   - a request that fails before executing (validation, an injected fault)
//     stores nothing, so the key can be sent again.
//
// Declines are stored and replayed like successes. Faults (5xx, delays,
// dropped responses) can be injected from Go (Inject) or over HTTP (POST
// /_emulator/faults), and GET /_emulator/stats counts PaymentIntents per
// idempotency key so tests can prove that nothing was charged twice.
//
// Routes:
//
//	POST /v1/payment_intents        create (and with confirm=true, confirm)
//	GET  /v1/payment_intents/{id}   retrieve
//	POST /_emulator/faults          inject one Fault or a JSON array of them
//	GET  /_emulator/faults          the faults still active
//	DELETE /_emulator/faults        clear faults
//	POST /_emulator/reset           clear faults and all state
//	GET  /_emulator/stats           Stats as JSON
package stripeemu

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// maxBody bounds a request body; Stripe's limit is larger, ours never needs to be.
const maxBody = 1 << 20

// Emulator is an http.Handler serving the emulated API. The zero value is not
// usable; create one with New. It is safe for concurrent use.
type Emulator struct {
	mux    *http.ServeMux
	logger *slog.Logger
	now    func() time.Time

	mu           sync.Mutex
	intents      map[string]*storedIntent // by PaymentIntent id
	keys         map[scope]*keyEntry
	createdByKey map[string]int
	created      int
	inFlight     int
	requests     []Request
	faults       []*activeFault
}

// scope is what an idempotency key is unique within: Stripe scopes keys to
// the account, which the API key stands for here.
type scope struct {
	apiKey, key string
}

// keyEntry is the state of one idempotency key.
type keyEntry struct {
	fingerprint string // method, path and canonical params of the first request
	done        bool
	status      int
	body        []byte
	requestID   string // of the request that executed
}

// storedIntent is a PaymentIntent and the API key (account) that owns it.
type storedIntent struct {
	apiKey string
	pi     paymentIntent
}

// Option configures an Emulator.
type Option func(*Emulator)

// WithLogger makes the emulator log every /v1 request and every fault change.
// Without it, it logs nothing.
func WithLogger(l *slog.Logger) Option {
	return func(e *Emulator) { e.logger = l }
}

// New returns an empty emulator with no faults.
func New(opts ...Option) *Emulator {
	e := &Emulator{
		mux:    http.NewServeMux(),
		logger: slog.New(slog.DiscardHandler),
		now:    time.Now,
	}
	for _, o := range opts {
		o(e)
	}
	e.reset()
	e.mux.HandleFunc("POST /v1/payment_intents", e.api(e.createPaymentIntent))
	e.mux.HandleFunc("GET /v1/payment_intents/{id}", e.api(e.retrievePaymentIntent))
	e.mux.HandleFunc("/v1/", e.api(e.unknownURL))
	e.mux.HandleFunc("POST /_emulator/faults", e.postFaults)
	e.mux.HandleFunc("GET /_emulator/faults", e.getFaults)
	e.mux.HandleFunc("DELETE /_emulator/faults", e.deleteFaults)
	e.mux.HandleFunc("POST /_emulator/reset", e.postReset)
	e.mux.HandleFunc("GET /_emulator/stats", e.getStats)
	return e
}

// ServeHTTP serves the routes listed in the package documentation.
func (e *Emulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mux.ServeHTTP(w, r)
}

// Inject adds a fault. It returns an error, and adds nothing, when the fault
// is invalid (unknown kind, status outside 400..599, delay without duration).
func (e *Emulator) Inject(f Fault) error {
	if err := f.validate(); err != nil {
		return err
	}
	e.mu.Lock()
	e.faults = append(e.faults, &activeFault{Fault: f, left: f.Count})
	e.mu.Unlock()
	e.logger.Info("stripe emulator: fault injected", "kind", f.Kind, "count", f.Count,
		"status", f.Status, "before", f.Before, "after", f.After)
	return nil
}

// Faults returns the faults that still apply, with Count set to the number of
// requests each still applies to (0 for every request).
func (e *Emulator) Faults() []Fault {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := []Fault{}
	for _, f := range e.faults {
		if f.Count > 0 && f.left == 0 {
			continue
		}
		g := f.Fault
		if g.Count > 0 {
			g.Count = f.left
		}
		out = append(out, g)
	}
	return out
}

// ClearFaults removes every fault.
func (e *Emulator) ClearFaults() {
	e.mu.Lock()
	e.faults = nil
	e.mu.Unlock()
}

// Reset removes every fault, PaymentIntent, idempotency key, count and logged
// request. Requests executing during a Reset finish against the new state.
func (e *Emulator) Reset() {
	e.mu.Lock()
	e.reset()
	e.mu.Unlock()
	e.logger.Info("stripe emulator: reset")
}

// reset clears the state; the caller holds mu, or owns e exclusively.
func (e *Emulator) reset() {
	e.intents = map[string]*storedIntent{}
	e.keys = map[scope]*keyEntry{}
	e.createdByKey = map[string]int{}
	e.created = 0
	e.requests = nil
	e.faults = nil
}

// Stats is a snapshot of what the emulator did, served by GET /_emulator/stats.
type Stats struct {
	// PaymentIntentsCreated counts every PaymentIntent created, declined ones
	// included.
	PaymentIntentsCreated int `json:"payment_intents_created"`
	// CreatedByKey maps an Idempotency-Key to the number of PaymentIntents
	// created with it, whatever the API key. More than 1 means a charge was
	// duplicated, which Stripe's rules make impossible for one API key.
	CreatedByKey map[string]int `json:"created_by_key"`
	// InFlight is the number of requests executing under an idempotency key
	// right now (claimed, result not stored yet).
	InFlight int `json:"in_flight"`
	// Requests logs every /v1 request in the order their responses were
	// decided.
	Requests []Request `json:"requests"`
}

// Request is one logged /v1 request.
type Request struct {
	// Method and Path are the request line, e.g. "POST" "/v1/payment_intents".
	Method string `json:"method"`
	Path   string `json:"path"`
	// IdempotencyKey is the Idempotency-Key header, "" if none.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Params is the canonical form of the parameters (form body or query):
	// URL-encoded with keys sorted, so equal parameters compare equal.
	Params string `json:"params"`
	// Status is the HTTP status answered, or that would have been answered
	// when Fault is "drop".
	Status int `json:"status"`
	// Replayed is true when the response was a stored one.
	Replayed bool `json:"replayed,omitempty"`
	// Fault names the injected fault that applied: "fail", "delay", "drop",
	// "delay+drop" or "".
	Fault string `json:"fault,omitempty"`
	// PaymentIntentID is the PaymentIntent the request created, returned or
	// declined, if any.
	PaymentIntentID string `json:"payment_intent_id,omitempty"`
}

// Stats returns a snapshot; the caller may keep and modify it.
func (e *Emulator) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	by := make(map[string]int, len(e.createdByKey))
	for k, n := range e.createdByKey {
		by[k] = n
	}
	return Stats{
		PaymentIntentsCreated: e.created,
		CreatedByKey:          by,
		InFlight:              e.inFlight,
		Requests:              append([]Request{}, e.requests...),
	}
}

// Created returns the number of PaymentIntents created with the idempotency
// key, across API keys.
func (e *Emulator) Created(idempotencyKey string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.createdByKey[idempotencyKey]
}

// TotalCreated returns the number of PaymentIntents created.
func (e *Emulator) TotalCreated() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.created
}

// InFlight returns the number of requests executing under an idempotency key.
func (e *Emulator) InFlight() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inFlight
}

// Requests returns the request log (see Stats.Requests).
func (e *Emulator) Requests() []Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Request{}, e.requests...)
}

// call is one authenticated /v1 request as the endpoint handlers see it.
type call struct {
	r         *http.Request
	apiKey    string
	idemKey   string
	params    url.Values
	canonical string
	requestID string
}

// response is what an endpoint decided to answer.
type response struct {
	status   int
	body     []byte
	replayed bool
	origReq  string // Original-Request header on replays
	piID     string
	faults   execFaults // delay and drop faults that apply (executed requests only)
}

// api wraps an endpoint with what every /v1 request gets: body parsing,
// authentication, fail faults, the request log, delays, drops and headers.
func (e *Emulator) api(endpoint func(*call) response) http.HandlerFunc {
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
		rec := Request{Method: r.Method, Path: r.URL.Path, IdempotencyKey: c.idemKey, Params: c.canonical}

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
			fail, failed := take(e.faults, FaultFail)
			e.mu.Unlock()
			if failed {
				resp = failResponse(fail.Status)
				rec.Fault = string(FaultFail)
			} else {
				resp = endpoint(c)
			}
		}

		rec.Status, rec.Replayed, rec.PaymentIntentID = resp.status, resp.replayed, resp.piID
		if name := resp.faults.name(); name != "" {
			rec.Fault = name
		}
		e.mu.Lock()
		e.requests = append(e.requests, rec)
		e.mu.Unlock()
		e.logger.Info("stripe emulator: request", "method", rec.Method, "path", rec.Path,
			"idempotency_key", rec.IdempotencyKey, "status", rec.Status, "replayed", rec.Replayed,
			"fault", rec.Fault, "payment_intent", rec.PaymentIntentID)

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
		if resp.status >= 500 {
			h.Set("Stripe-Should-Retry", "true")
		}
		w.WriteHeader(resp.status)
		_, _ = w.Write(resp.body)
	}
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

// createPaymentIntent serves POST /v1/payment_intents under Stripe's
// idempotency rules.
func (e *Emulator) createPaymentIntent(c *call) response {
	fingerprint := "POST /v1/payment_intents?" + c.canonical
	sc := scope{c.apiKey, c.idemKey}
	var entry *keyEntry
	if c.idemKey != "" {
		e.mu.Lock()
		prev, ok := e.keys[sc]
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
			return response{status: prev.status, body: prev.body, replayed: true, origReq: prev.requestID, piID: piIDOf(prev.body)}
		}
		entry = &keyEntry{fingerprint: fingerprint}
		e.keys[sc] = entry
		e.inFlight++
		e.mu.Unlock()
	}

	p, perr := parseCreate(c.params)
	if perr != nil {
		// Failed validation: Stripe saves no result, the key may be reused.
		if entry != nil {
			e.mu.Lock()
			if e.keys[sc] == entry {
				delete(e.keys, sc)
			}
			e.inFlight--
			e.mu.Unlock()
		}
		return errResponse(http.StatusBadRequest, perr)
	}

	x := e.takeExecFaults()
	if x.before > 0 {
		time.Sleep(x.before)
	}

	pi := e.newIntent(p)
	status, body := http.StatusOK, mustJSON(pi)
	if d, declined := declines[p.paymentMethod]; declined && p.confirm {
		status = http.StatusPaymentRequired
		body = mustJSON(errorBody{Error: &apiError{Type: "card_error", Code: d.code, DeclineCode: d.declineCode,
			Message: d.message, Charge: deref(pi.LatestCharge), DocURL: "https://docs.stripe.com/error-codes/" + strings.ReplaceAll(d.code, "_", "-"),
			PaymentIntent: &pi}})
	}

	e.mu.Lock()
	e.intents[pi.ID] = &storedIntent{apiKey: c.apiKey, pi: pi}
	e.created++
	if entry != nil {
		e.createdByKey[c.idemKey]++
		entry.done, entry.status, entry.body, entry.requestID = true, status, body, c.requestID
		e.inFlight--
	}
	e.mu.Unlock()
	return response{status: status, body: body, piID: pi.ID, faults: x}
}

// newIntent creates the PaymentIntent for p, confirmed when p.confirm.
func (e *Emulator) newIntent(p createParams) paymentIntent {
	id := newID("pi")
	pi := paymentIntent{
		ID: id, Object: "payment_intent", Amount: p.amount, CaptureMethod: p.captureMethod,
		ClientSecret: id + "_secret_" + newID("s")[2:], ConfirmationMethod: "automatic",
		Created: e.now().Unix(), Currency: p.currency, Description: p.description,
		Metadata: p.metadata, PaymentMethodTypes: p.pmTypes, Status: "requires_payment_method",
	}
	if p.paymentMethod != "" {
		pi.PaymentMethod = &p.paymentMethod
		pi.Status = "requires_confirmation"
	}
	if !p.confirm {
		return pi
	}
	switch d, declined := declines[p.paymentMethod]; {
	case declined:
		charge := newID("ch")
		pi.LatestCharge = &charge
		pi.Status = "requires_payment_method"
		pi.LastPaymentError = &apiError{Type: "card_error", Code: d.code, DeclineCode: d.declineCode,
			Message: d.message, Charge: charge}
	case requiresAction[p.paymentMethod]:
		pi.Status = "requires_action"
		pi.NextAction = &nextAction{Type: "use_stripe_sdk"}
	case p.captureMethod == "manual":
		charge := newID("ch")
		pi.LatestCharge = &charge
		pi.Status = "requires_capture"
		pi.AmountCapturable = p.amount
	default:
		charge := newID("ch")
		pi.LatestCharge = &charge
		pi.Status = "succeeded"
		pi.AmountReceived = p.amount
	}
	return pi
}

// retrievePaymentIntent serves GET /v1/payment_intents/{id}; another API key's
// PaymentIntent is a 404, as another account's is on Stripe.
func (e *Emulator) retrievePaymentIntent(c *call) response {
	id := c.r.PathValue("id")
	e.mu.Lock()
	s, ok := e.intents[id]
	e.mu.Unlock()
	if !ok || s.apiKey != c.apiKey {
		return errResponse(http.StatusNotFound, &apiError{Type: "invalid_request_error", Code: "resource_missing",
			Param: "intent", Message: "No such payment_intent: '" + id + "'"})
	}
	x := e.takeExecFaults()
	if x.before > 0 {
		time.Sleep(x.before)
	}
	return response{status: http.StatusOK, body: mustJSON(s.pi), piID: id, faults: x}
}

// unknownURL answers any other /v1 route the way Stripe does.
func (e *Emulator) unknownURL(c *call) response {
	return errResponse(http.StatusNotFound, &apiError{Type: "invalid_request_error",
		Message: "Unrecognized request URL (" + c.r.Method + ": " + c.r.URL.Path + ")."})
}

// takeExecFaults consumes the delay and drop faults for one executing request.
func (e *Emulator) takeExecFaults() execFaults {
	e.mu.Lock()
	defer e.mu.Unlock()
	var x execFaults
	if f, ok := take(e.faults, FaultDelay); ok {
		x.before, x.after = f.Before, f.After
	}
	_, x.drop = take(e.faults, FaultDrop)
	return x
}

// errResponse is a Stripe error response.
func errResponse(status int, err *apiError) response {
	return response{status: status, body: mustJSON(errorBody{Error: err})}
}

// failResponse is the answer of an injected FaultFail.
func failResponse(status int) response {
	if status == http.StatusTooManyRequests {
		return errResponse(status, &apiError{Type: "invalid_request_error", Code: "rate_limit",
			Message: "Too many requests hit the API too quickly (stripe emulator fault)."})
	}
	return errResponse(status, &apiError{Type: "api_error",
		Message: "An unknown error occurred (stripe emulator fault)."})
}

// piIDOf extracts the PaymentIntent id from a stored body, a PaymentIntent or
// an error carrying one.
func piIDOf(body []byte) string {
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

// deref returns *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// postFaults serves POST /_emulator/faults: one Fault object or an array.
// It answers 204, or 400 with {"error":"…"} when any fault is invalid (then
// none is added).
func (e *Emulator) postFaults(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeAdminError(w, err)
		return
	}
	var faults []Fault
	if trimmed := bytes.TrimSpace(body); len(trimmed) > 0 && trimmed[0] == '[' {
		err = json.Unmarshal(trimmed, &faults)
	} else {
		var f Fault
		err = json.Unmarshal(trimmed, &f)
		faults = []Fault{f}
	}
	if err != nil {
		writeAdminError(w, err)
		return
	}
	for i := range faults {
		if err := faults[i].validate(); err != nil {
			writeAdminError(w, err)
			return
		}
	}
	for _, f := range faults {
		if err := e.Inject(f); err != nil { // already validated; cannot fail
			writeAdminError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// getFaults serves GET /_emulator/faults: the JSON array of Faults().
func (e *Emulator) getFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, e.Faults())
}

// deleteFaults serves DELETE /_emulator/faults.
func (e *Emulator) deleteFaults(w http.ResponseWriter, _ *http.Request) {
	e.ClearFaults()
	w.WriteHeader(http.StatusNoContent)
}

// postReset serves POST /_emulator/reset.
func (e *Emulator) postReset(w http.ResponseWriter, _ *http.Request) {
	e.Reset()
	w.WriteHeader(http.StatusNoContent)
}

// getStats serves GET /_emulator/stats.
func (e *Emulator) getStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, e.Stats())
}

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// writeAdminError answers 400 {"error": "..."} to a bad /_emulator request.
func writeAdminError(w http.ResponseWriter, err error) {
	var tooBig *http.MaxBytesError
	status := http.StatusBadRequest
	if errors.As(err, &tooBig) {
		status = http.StatusRequestEntityTooLarge
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}
