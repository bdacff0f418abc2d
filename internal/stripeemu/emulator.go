// Package stripeemu is a stateful, in-memory emulator of Stripe's
// PaymentIntents and Refunds APIs over real HTTP, for tests and the local
// stack. Where it and our service disagree, Stripe's documented behaviour
// wins; every rule cites its source.
//
// It follows Stripe's idempotency rules
// (https://docs.stripe.com/api/idempotent_requests), scoped per API key, for
// every POST:
//   - the status and body of the first execution under an Idempotency-Key
//     are stored, 500 errors included, and replayed byte for byte with the
//     header Idempotent-Replayed: true, for KeyTTL (default 24h, "keys ...
//     at least 24 hours old" may be pruned); after that the key is pruned and
//     runs as a new request;
//   - the same key with other parameters (or another endpoint) is a 400
//     idempotency_error;
//   - the same key while the first request with it still executes is a 409
//     with code idempotency_key_in_use;
//   - a request that fails before executing (validation, an unknown
//     PaymentMethod, an injected fail fault: 429, 503, 5xx) stores nothing,
//     so the key can be sent again.
//
// Declines are stored and replayed like successes. Faults (5xx, stored 500s
// rolled forward or not, 429 rate_limit or lock_timeout, delays, dropped
// responses), each optionally limited to one operation, can be injected from
// Go (Inject) or over HTTP (POST /_emulator/faults). GET /_emulator/stats
// counts PaymentIntents per idempotency key and GET /_emulator/state returns
// every object, so tests can prove that nothing was charged twice.
//
// Stripe routes (form-encoded, as stripe-go v76 sends them):
//
//	POST /v1/payment_intents               create (confirm=true: and confirm)
//	GET  /v1/payment_intents               list, newest first
//	GET  /v1/payment_intents/search        search (lags by SearchLag)
//	GET  /v1/payment_intents/{id}          retrieve
//	POST /v1/payment_intents/{id}          update (a new payment_method: requires_confirmation)
//	POST /v1/payment_intents/{id}/confirm  confirm
//	POST /v1/payment_intents/{id}/cancel   cancel
//	GET  /v1/charges/{id}                  retrieve a PaymentIntent's charge
//	POST /v1/refunds                       refund a succeeded PaymentIntent
//	GET  /v1/refunds                       list (payment_intent=, charge=), newest first
//	GET  /v1/refunds/{id}                  retrieve
//
// The 3D Secure challenge page (HTML, for the customer's browser; see
// WithPublicURL): next_action.redirect_to_url.url points to it.
//
//	GET  /3d_secure_2/hosted               the page: complete or fail authentication
//	POST /3d_secure_2/hosted               play it, then back to the return_url
//
// Control routes (JSON, not Stripe's):
//
//	POST   /_emulator/faults              inject one Fault or a JSON array of them
//	GET    /_emulator/faults              the faults still active
//	DELETE /_emulator/faults              clear faults
//	POST   /_emulator/reset               clear faults and all state
//	GET    /_emulator/stats               Stats as JSON
//	GET    /_emulator/state               every PaymentIntent and refund
//	POST   /_emulator/keys/prune          forget every stored idempotency key
//	POST   /_emulator/payment_intents/{id}/authenticate  play a 3D Secure challenge
//	POST   /_emulator/refunds/pending     {"on":bool}: new refunds start pending
//	POST   /_emulator/refunds/{id}/succeed  a pending refund succeeds
//	POST   /_emulator/refunds/{id}/fail   a refund fails (later), amount refundable again
//	GET    /_emulator/webhooks            WebhookLog: events and delivery attempts
//	POST   /_emulator/webhooks/faults     inject one HookFault or an array
//	GET    /_emulator/webhooks/faults     the webhook faults still active
//	DELETE /_emulator/webhooks/faults     clear webhook faults
//
// Webhooks (WithWebhookURL): every change (payment_intent.created,
// .requires_action, .succeeded, .payment_failed, .canceled,
// .amount_capturable_updated; refund.created, refund.updated, refund.failed;
// charge.refunded) is an Event with api_version stripe.APIVersion and the
// object's full JSON in data.object, POSTed asynchronously with a
// Stripe-Signature header (see Sign) and resent with exponential backoff
// while the endpoint answers non-2xx, for a bounded time.
package stripeemu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v76"
)

// maxBody bounds a request body; Stripe's limit is larger, ours never needs to be.
const maxBody = 1 << 20

// DefaultKeyTTL is how long a stored idempotency result is replayed: Stripe
// prunes keys "after they're at least 24 hours old"
// (https://docs.stripe.com/api/idempotent_requests).
const DefaultKeyTTL = 24 * time.Hour

// Emulator is an http.Handler serving the emulated API. The zero value is not
// usable; create one with New and stop it with Close. It is safe for
// concurrent use.
type Emulator struct {
	mux       *http.ServeMux
	logger    *slog.Logger
	now       func() time.Time
	keyTTL    time.Duration
	searchLag time.Duration
	publicURL string // where browsers reach the challenge page (WithPublicURL)

	mu             sync.Mutex
	intents        map[string]*storedIntent // by PaymentIntent id
	intentOrder    []*storedIntent          // in creation order
	charges        map[string]*charge       // by charge id
	refunds        map[string]*storedRefund // by refund id
	refundOrder    []*storedRefund          // in creation order
	refundsPending bool                     // new refunds start pending
	keys           map[scope]*keyEntry
	createdByKey   map[string]int
	created        int
	inFlight       int
	requests       []Request
	faults         []*activeFault
	timers         map[*time.Timer]struct{} // roll-forwards not run yet
	gen            uint64                   // bumped by Reset: older roll-forwards do nothing
	closed         bool
	running        sync.WaitGroup // roll-forwards executing
	hook           hooks
}

// scope is what an idempotency key is unique within: Stripe scopes keys to
// the account, which the API key stands for here.
type scope struct {
	apiKey, key string
}

// keyEntry is the state of one idempotency key.
type keyEntry struct {
	fingerprint string // method, path and canonical params of the first request
	claimed     time.Time
	done        bool
	status      int
	body        []byte
	requestID   string // of the request that executed
}

// storedIntent is a PaymentIntent and the API key (account) that owns it.
type storedIntent struct {
	apiKey    string
	createdAt time.Time
	pi        paymentIntent
	// returnURL is the return_url of the latest confirmation ("" for
	// none): where the challenge page sends the customer back to.
	returnURL string
}

// Option configures an Emulator.
type Option func(*Emulator)

// WithLogger makes the emulator log every /v1 request and every fault change.
// Without it, it logs nothing.
func WithLogger(l *slog.Logger) Option {
	return func(e *Emulator) { e.logger = l }
}

// WithKeyTTL sets how long a stored idempotency result is replayed before its
// key is pruned (default DefaultKeyTTL; d <= 0 keeps the default).
func WithKeyTTL(d time.Duration) Option {
	return func(e *Emulator) {
		if d > 0 {
			e.keyTTL = d
		}
	}
}

// WithSearchLag makes an object appear in search results only d after it was
// created, as Stripe's search index does: "data is searchable in under 1
// minute" and search must not be used for read-after-write
// (https://docs.stripe.com/search#data-freshness). Default 0. GET by id and
// list are never lagged.
func WithSearchLag(d time.Duration) Option {
	return func(e *Emulator) { e.searchLag = max(d, 0) }
}

// WithClock replaces time.Now for key ages, search lag and the created
// timestamps of objects (not for delays and roll-forwards, which sleep).
func WithClock(now func() time.Time) Option {
	return func(e *Emulator) { e.now = now }
}

// New returns an empty emulator with no faults.
func New(opts ...Option) *Emulator {
	e := &Emulator{
		mux:       http.NewServeMux(),
		logger:    slog.New(slog.DiscardHandler),
		now:       time.Now,
		keyTTL:    DefaultKeyTTL,
		publicURL: defaultPublicURL,
		timers:    map[*time.Timer]struct{}{},
	}
	e.initHooks()
	for _, o := range opts {
		o(e)
	}
	e.reset()
	e.startHooks()
	e.mux.HandleFunc("POST /v1/payment_intents", e.api(OpPICreate, e.createPaymentIntent))
	e.mux.HandleFunc("GET /v1/payment_intents", e.api(OpPIList, e.listPaymentIntents))
	e.mux.HandleFunc("GET /v1/payment_intents/search", e.api(OpPISearch, e.searchPaymentIntents))
	e.mux.HandleFunc("GET /v1/payment_intents/{id}", e.api(OpPIRetrieve, e.retrievePaymentIntent))
	e.mux.HandleFunc("POST /v1/payment_intents/{id}", e.api(OpPIUpdate, e.updatePaymentIntent))
	e.mux.HandleFunc("POST /v1/payment_intents/{id}/confirm", e.api(OpPIConfirm, e.confirmPaymentIntent))
	e.mux.HandleFunc("POST /v1/payment_intents/{id}/cancel", e.api(OpPICancel, e.cancelPaymentIntent))
	e.mux.HandleFunc("GET /v1/charges/{id}", e.api(OpChargeRetrieve, e.retrieveCharge))
	e.mux.HandleFunc("POST /v1/refunds", e.api(OpRefundCreate, e.createRefund))
	e.mux.HandleFunc("GET /v1/refunds", e.api(OpRefundList, e.listRefunds))
	e.mux.HandleFunc("GET /v1/refunds/{id}", e.api(OpRefundRetrieve, e.retrieveRefund))
	e.mux.HandleFunc("/v1/", e.api("", e.unknownURL))
	e.mux.HandleFunc("GET "+challengePath, e.getChallenge)
	e.mux.HandleFunc("POST "+challengePath, e.postChallenge)
	e.mux.HandleFunc("POST /_emulator/faults", e.postFaults)
	e.mux.HandleFunc("GET /_emulator/faults", e.getFaults)
	e.mux.HandleFunc("DELETE /_emulator/faults", e.deleteFaults)
	e.mux.HandleFunc("POST /_emulator/reset", e.postReset)
	e.mux.HandleFunc("GET /_emulator/stats", e.getStats)
	e.mux.HandleFunc("GET /_emulator/state", e.getState)
	e.mux.HandleFunc("POST /_emulator/keys/prune", e.postPruneKeys)
	e.mux.HandleFunc("POST /_emulator/payment_intents/{id}/authenticate", e.postAuthenticate)
	e.mux.HandleFunc("POST /_emulator/payment_intents/{id}/dashboard_cancel", e.postDashboardCancel)
	e.mux.HandleFunc("POST /_emulator/payment_intents/{id}/dashboard_refund", e.postDashboardRefund)
	e.mux.HandleFunc("POST /_emulator/refunds/pending", e.postRefundsPending)
	e.mux.HandleFunc("POST /_emulator/refunds/{id}/succeed", e.postRefundSucceed)
	e.mux.HandleFunc("POST /_emulator/refunds/{id}/fail", e.postRefundFail)
	e.mux.HandleFunc("GET /_emulator/webhooks", e.getWebhooks)
	e.mux.HandleFunc("POST /_emulator/webhooks/faults", e.postWebhookFaults)
	e.mux.HandleFunc("GET /_emulator/webhooks/faults", e.getWebhookFaults)
	e.mux.HandleFunc("DELETE /_emulator/webhooks/faults", e.deleteWebhookFaults)
	return e
}

// ServeHTTP serves the routes listed in the package documentation.
func (e *Emulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mux.ServeHTTP(w, r)
}

// Close stops the emulator's background work: roll-forwards not run yet are
// dropped, the webhook dispatcher stops and deliveries in progress are
// abandoned; Close waits for all of them. Requests served after Close still
// work, but schedule and deliver nothing. Close is idempotent.
func (e *Emulator) Close() {
	e.mu.Lock()
	e.closed = true
	e.stopTimersLocked()
	e.mu.Unlock()
	e.running.Wait()
	e.closeHooks()
}

// Inject adds a fault. It returns an error, and adds nothing, when the fault
// is invalid (unknown kind or op, status outside 400..599, delay without
// duration, roll_forward on another kind than stored_500).
func (e *Emulator) Inject(f Fault) error {
	if err := f.validate(); err != nil {
		return err
	}
	e.mu.Lock()
	e.faults = append(e.faults, &activeFault{Fault: f, left: f.Count})
	e.mu.Unlock()
	e.logger.Info("stripe emulator: fault injected", "kind", f.Kind, "op", f.Op, "count", f.Count,
		"status", f.Status, "code", f.Code, "before", f.Before, "after", f.After, "roll_forward", f.RollForward)
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

// Reset removes every fault (webhook faults too), PaymentIntent, charge,
// refund, idempotency key, count, logged request, pending roll-forward and
// webhook event (deliveries in progress are abandoned), and ends pending
// refund mode. Requests executing during a Reset
// finish against the new state.
func (e *Emulator) Reset() {
	e.mu.Lock()
	e.reset()
	e.stopTimersLocked()
	e.resetHooksLocked()
	e.gen++
	e.mu.Unlock()
	e.logger.Info("stripe emulator: reset")
}

// reset clears the state; the caller holds mu, or owns e exclusively.
func (e *Emulator) reset() {
	e.intents = map[string]*storedIntent{}
	e.intentOrder = nil
	e.charges = map[string]*charge{}
	e.refunds = map[string]*storedRefund{}
	e.refundOrder = nil
	e.refundsPending = false
	e.keys = map[scope]*keyEntry{}
	e.createdByKey = map[string]int{}
	e.created = 0
	e.requests = nil
	e.faults = nil
}

// stopTimersLocked drops every pending roll-forward; the caller holds mu.
func (e *Emulator) stopTimersLocked() {
	for t := range e.timers {
		t.Stop()
	}
	clear(e.timers)
}

// PruneKeys forgets every stored idempotency key now, as if KeyTTL had
// passed for all of them, and returns how many it forgot. Keys whose request
// still executes are kept.
func (e *Emulator) PruneKeys() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for sc, k := range e.keys {
		if k.done {
			delete(e.keys, sc)
			n++
		}
	}
	return n
}

// Stats is a snapshot of what the emulator did, served by GET /_emulator/stats.
type Stats struct {
	// PaymentIntentsCreated counts every PaymentIntent created, declined ones
	// and rolled-forward ones included.
	PaymentIntentsCreated int `json:"payment_intents_created"`
	// CreatedByKey maps an Idempotency-Key to the number of PaymentIntents
	// created with it, whatever the API key. More than 1 means the key was
	// used again after it was pruned (or by another account).
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
	// Op is the operation, one of the Op* constants ("" for an unknown URL).
	Op string `json:"op,omitempty"`
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
	// Fault names the injected fault that applied: "fail", "stored_500",
	// "delay", "drop", "delay+drop" or "".
	Fault string `json:"fault,omitempty"`
	// PaymentIntentID is the PaymentIntent the request created, returned,
	// confirmed, canceled or declined, if any.
	PaymentIntentID string `json:"payment_intent_id,omitempty"`
	// RefundID is the refund the request created or returned, if any.
	RefundID string `json:"refund_id,omitempty"`
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

// PaymentIntents returns every PaymentIntent of every account, in creation
// order, as stripe-go v76 decodes the emulator's JSON (latest_charge
// expanded, so LatestCharge.AmountRefunded is current). Search lag does not
// apply.
func (e *Emulator) PaymentIntents() []*stripe.PaymentIntent {
	e.mu.Lock()
	raw := make([][]byte, 0, len(e.intentOrder))
	for _, s := range e.intentOrder {
		raw = append(raw, mustJSON(e.renderPILocked(s, []string{"latest_charge"})))
	}
	e.mu.Unlock()
	out := make([]*stripe.PaymentIntent, 0, len(raw))
	for _, b := range raw {
		var pi stripe.PaymentIntent
		if err := json.Unmarshal(b, &pi); err != nil {
			panic("stripeemu: decode own PaymentIntent: " + err.Error())
		}
		out = append(out, &pi)
	}
	return out
}

// State is the body of GET /_emulator/state: every object, in creation
// order, in Stripe's JSON (PaymentIntents with latest_charge expanded).
type State struct {
	PaymentIntents []json.RawMessage `json:"payment_intents"`
	Refunds        []json.RawMessage `json:"refunds"`
}

// State returns every PaymentIntent and refund as Stripe JSON.
func (e *Emulator) State() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := State{PaymentIntents: []json.RawMessage{}, Refunds: []json.RawMessage{}}
	for _, s := range e.intentOrder {
		st.PaymentIntents = append(st.PaymentIntents, compactJSON(e.renderPILocked(s, []string{"latest_charge"})))
	}
	for _, rf := range e.refundOrder {
		st.Refunds = append(st.Refunds, compactJSON(rf.r))
	}
	return st
}

// Authenticate plays the customer's 3D Secure challenge on a PaymentIntent in
// requires_action (https://docs.stripe.com/payments/3d-secure/authentication-flow,
// https://docs.stripe.com/testing#regulatory-cards): success moves it to
// succeeded (requires_capture for manual capture); failure to
// requires_payment_method with last_payment_error code
// payment_intent_authentication_failure
// (https://docs.stripe.com/error-codes#payment-intent-authentication-failure).
// It returns the PaymentIntent's JSON, ErrNotFound, or an error naming the
// status when it is not requires_action.
func (e *Emulator) Authenticate(id string, succeed bool) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.intents[id]
	if !ok {
		return nil, ErrNotFound
	}
	return e.authenticateLocked(s, succeed)
}

// authenticateLocked is Authenticate of s; the caller holds mu.
func (e *Emulator) authenticateLocked(s *storedIntent, succeed bool) ([]byte, error) {
	id := s.pi.ID
	if s.pi.Status != statusRequiresAction {
		return nil, fmt.Errorf("%w: payment_intent %s is %s, not requires_action", ErrWrongState, id, s.pi.Status)
	}
	s.pi.NextAction = nil
	if succeed {
		e.succeedLocked(s)
	} else {
		s.pi.Status = statusRequiresPaymentMethod
		s.pi.LastPaymentError = &apiError{Type: "invalid_request_error", Code: "payment_intent_authentication_failure",
			Message: "The provided PaymentMethod has failed authentication. You can provide payment_method_data or a new " +
				"PaymentMethod to attempt to fulfill this PaymentIntent again.",
			DocURL: "https://docs.stripe.com/error-codes/payment-intent-authentication-failure"}
		e.emitPILocked("payment_intent.payment_failed", s)
	}
	return mustJSON(e.renderPILocked(s, nil)), nil
}

// Errors of the Go control methods.
var (
	// ErrNotFound: no object with that id.
	ErrNotFound = errors.New("stripe emulator: no such object")
	// ErrWrongState: the object is not in a state the control applies to.
	ErrWrongState = errors.New("stripe emulator: wrong state")
)

// compactJSON returns b without indentation.
func compactJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("stripeemu: encode: " + err.Error())
	}
	return b
}

// postFaults serves POST /_emulator/faults: one Fault object or an array.
// It answers 204, or 400 with {"error":"…"} when any fault is invalid (then
// none is added).
func (e *Emulator) postFaults(w http.ResponseWriter, r *http.Request) {
	faults, ok := decodeFaults[Fault](w, r)
	if !ok {
		return
	}
	for _, f := range faults {
		if err := e.Inject(f); err != nil { // already validated; cannot fail
			writeAdminError(w, http.StatusBadRequest, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeFaults reads an admin POST body holding one fault object or an
// array of them and validates each. On any error it answers 400
// {"error":…} and returns false, so that none of them is added.
func decodeFaults[F any, PF interface {
	*F
	validate() error
}](w http.ResponseWriter, r *http.Request) ([]F, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeAdminError(w, http.StatusBadRequest, err)
		return nil, false
	}
	var faults []F
	if trimmed := bytes.TrimSpace(body); len(trimmed) > 0 && trimmed[0] == '[' {
		err = json.Unmarshal(trimmed, &faults)
	} else {
		var f F
		err = json.Unmarshal(trimmed, &f)
		faults = []F{f}
	}
	if err != nil {
		writeAdminError(w, http.StatusBadRequest, err)
		return nil, false
	}
	for i := range faults {
		if err := PF(&faults[i]).validate(); err != nil {
			writeAdminError(w, http.StatusBadRequest, err)
			return nil, false
		}
	}
	return faults, true
}

// getFaults serves GET /_emulator/faults: the JSON array of Faults().
func (e *Emulator) getFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.Faults())
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
	writeJSON(w, http.StatusOK, e.Stats())
}

// getState serves GET /_emulator/state:
// {"payment_intents":[…Stripe JSON…],"refunds":[…Stripe JSON…]}.
func (e *Emulator) getState(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.State())
}

// postPruneKeys serves POST /_emulator/keys/prune: 200 {"pruned":N}.
func (e *Emulator) postPruneKeys(w http.ResponseWriter, _ *http.Request) {
	n := e.PruneKeys()
	e.logger.Info("stripe emulator: idempotency keys pruned", "pruned", n)
	writeJSON(w, http.StatusOK, map[string]int{"pruned": n})
}

// postAuthenticate serves POST /_emulator/payment_intents/{id}/authenticate
// with {"outcome":"succeed"|"fail"}: 200 with the PaymentIntent's Stripe
// JSON; 400 for another outcome; 404 for an unknown id; 409 when the
// PaymentIntent is not in requires_action. Errors are {"error":"…"}.
func (e *Emulator) postAuthenticate(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Outcome string `json:"outcome"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&in); err != nil {
		writeAdminError(w, http.StatusBadRequest, err)
		return
	}
	if in.Outcome != "succeed" && in.Outcome != "fail" {
		writeAdminError(w, http.StatusBadRequest, fmt.Errorf("outcome %q: want succeed or fail", in.Outcome))
		return
	}
	body, err := e.Authenticate(r.PathValue("id"), in.Outcome == "succeed")
	if err != nil {
		writeControlError(w, err)
		return
	}
	e.logger.Info("stripe emulator: 3D Secure challenge played", "payment_intent", r.PathValue("id"), "outcome", in.Outcome)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// writeControlError answers a Go control method's error: 404 for
// ErrNotFound, 409 for ErrWrongState.
func writeControlError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		writeAdminError(w, http.StatusNotFound, err)
	case errors.Is(err, ErrWrongState):
		writeAdminError(w, http.StatusConflict, err)
	default:
		writeAdminError(w, http.StatusBadRequest, err)
	}
}

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeAdminError answers {"error": "..."} to a bad /_emulator request, with
// status (413 instead when the body was too large).
func writeAdminError(w http.ResponseWriter, status int, err error) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		status = http.StatusRequestEntityTooLarge
	}
	writeJSON(w, status, map[string]string{"error": err.Error()})
}
