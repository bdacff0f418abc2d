package stripeemu

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/stripe/stripe-go/v76"
)

// Webhook defaults.
const (
	// DefaultWebhookSecret is the signing secret when none is configured; the
	// service's STRIPE_WEBHOOK_SECRET has the same default.
	DefaultWebhookSecret = "whsec_test_checkout"
	// DefaultWebhookMaxElapsed bounds the resends of one event. Stripe resends
	// for up to three days (https://docs.stripe.com/webhooks#retries); an
	// emulator that outlives its test must stop sooner.
	DefaultWebhookMaxElapsed = 10 * time.Minute
	// webhookAttemptTimeout bounds one delivery attempt.
	webhookAttemptTimeout = 10 * time.Second
	// shuffleIdleFlush releases a shuffle window that is not full when no
	// event has joined it for this long, so a quiet stack still converges.
	shuffleIdleFlush = time.Second
	// defaultShuffleWindow is a shuffle fault's window when it names none.
	defaultShuffleWindow = 10
)

// WithWebhookURL makes the emulator POST a signed event for every change it
// makes to url ("" sends none, the default).
func WithWebhookURL(url string) Option {
	return func(e *Emulator) { e.hook.url = url }
}

// WithWebhookSecret sets the signing secret (default DefaultWebhookSecret).
func WithWebhookSecret(secret string) Option {
	return func(e *Emulator) {
		if secret != "" {
			e.hook.secret = secret
		}
	}
}

// WithWebhookRetry sets the resend schedule of an event whose delivery
// failed (non-2xx or no answer): exponential backoff from initial up to
// maxInterval between attempts, for at most maxElapsed (defaults 500ms, 1m,
// DefaultWebhookMaxElapsed; zero keeps a default).
func WithWebhookRetry(initial, maxInterval, maxElapsed time.Duration) Option {
	return func(e *Emulator) {
		if initial > 0 {
			e.hook.initial = initial
		}
		if maxInterval > 0 {
			e.hook.maxInterval = maxInterval
		}
		if maxElapsed > 0 {
			e.hook.maxElapsed = maxElapsed
		}
	}
}

// WithWebhookClient sets the HTTP client that delivers webhooks (default: a
// client with a 10s timeout per attempt).
func WithWebhookClient(c *http.Client) Option {
	return func(e *Emulator) { e.hook.client = c }
}

// event is Stripe's Event object (https://docs.stripe.com/api/events/object).
type event struct {
	ID              string       `json:"id"`
	Object          string       `json:"object"`
	APIVersion      string       `json:"api_version"`
	Created         int64        `json:"created"`
	Data            eventData    `json:"data"`
	Livemode        bool         `json:"livemode"`
	PendingWebhooks int          `json:"pending_webhooks"`
	Request         eventRequest `json:"request"`
	Type            string       `json:"type"`
}

// eventData holds the object as it was when the event happened, in full.
type eventData struct {
	Object json.RawMessage `json:"object"`
}

// eventRequest is the API request that caused the event; null fields, as
// for Stripe's automatic changes.
type eventRequest struct {
	ID             *string `json:"id"`
	IdempotencyKey *string `json:"idempotency_key"`
}

// emitted is an event and its delivery state.
type emitted struct {
	WebhookEvent
	payload []byte
	gen     uint64
}

// WebhookEvent is one event in the webhook log.
type WebhookEvent struct {
	// ID is the event id, "evt_…".
	ID string `json:"id"`
	// Type is e.g. "payment_intent.succeeded".
	Type string `json:"type"`
	// ObjectID is the id of data.object ("pi_…", "re_…", "ch_…").
	ObjectID string `json:"object_id"`
	// Status is "unsent" (no webhook URL), "held" (in a shuffle window),
	// "pending" (being delivered or waiting for a resend), "delivered" (a
	// 2xx was received) or "failed" (resends gave up).
	Status string `json:"status"`
}

// WebhookAttempt is one delivery attempt in the webhook log.
type WebhookAttempt struct {
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	// Attempt counts the attempts of one delivery, from 1.
	Attempt int `json:"attempt"`
	// Status is the HTTP status received, 0 when none.
	Status int `json:"status"`
	// Error is the transport error, if any.
	Error string `json:"error,omitempty"`
	// Dropped is true for an attempt a drop_first fault swallowed.
	Dropped bool `json:"dropped,omitempty"`
	// Duplicate is true for the second delivery a duplicate fault made.
	Duplicate bool `json:"duplicate,omitempty"`
	// At is when the attempt ended.
	At time.Time `json:"at"`
}

// WebhookLog is the body of GET /_emulator/webhooks.
type WebhookLog struct {
	// URL is where webhooks go, "" for nowhere.
	URL string `json:"url"`
	// Events are every event emitted since the last Reset, in order.
	Events []WebhookEvent `json:"events"`
	// Attempts are the delivery attempts, in the order they ended.
	Attempts []WebhookAttempt `json:"attempts"`
}

// HookFaultKind names a webhook fault.
type HookFaultKind string

// The webhook fault kinds. Stripe delivers each event at least once and in
// no guaranteed order ("Stripe doesn't guarantee the delivery of events in
// the order that they're generated", https://docs.stripe.com/webhooks#event-ordering;
// "your webhook endpoints might occasionally receive the same event more
// than once", https://docs.stripe.com/webhooks#handle-duplicate-events).
const (
	// HookDuplicate delivers each event twice, concurrently.
	HookDuplicate HookFaultKind = "duplicate"
	// HookShuffle holds HookFault.Window events and releases them in random
	// order (a window not full is released after a second without events).
	HookShuffle HookFaultKind = "shuffle"
	// HookDelay delays an event's first attempt by HookFault.Delay.
	HookDelay HookFaultKind = "delay"
	// HookDropFirst swallows an event's first attempt; the resend delivers it.
	HookDropFirst HookFaultKind = "drop_first"
)

// HookFault is one webhook fault. Its JSON form, accepted by POST
// /_emulator/webhooks/faults (one object or an array), is
//
//	{"kind":"duplicate","count":3}
//	{"kind":"shuffle","window":5}
//	{"kind":"delay","count":1,"delay":"1s"}
//	{"kind":"drop_first"}
type HookFault struct {
	Kind HookFaultKind
	// Count is how many events (windows, for shuffle) it applies to; 0 means
	// all until cleared.
	Count int
	// Window is the number of events a shuffle holds (default 10, at least 2).
	Window int
	// Delay is how long a delay fault holds an event's first attempt.
	Delay time.Duration
}

// hookFaultJSON is the wire form of HookFault.
type hookFaultJSON struct {
	Kind   HookFaultKind `json:"kind"`
	Count  int           `json:"count,omitempty"`
	Window int           `json:"window,omitempty"`
	Delay  string        `json:"delay,omitempty"`
}

// MarshalJSON encodes f in the form POST /_emulator/webhooks/faults accepts.
func (f HookFault) MarshalJSON() ([]byte, error) {
	j := hookFaultJSON{Kind: f.Kind, Count: f.Count, Window: f.Window}
	if f.Delay > 0 {
		j.Delay = f.Delay.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes the form shown on HookFault.
func (f *HookFault) UnmarshalJSON(data []byte) error {
	var j hookFaultJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	out := HookFault{Kind: j.Kind, Count: j.Count, Window: j.Window}
	if j.Delay != "" {
		d, err := time.ParseDuration(j.Delay)
		if err != nil {
			return fmt.Errorf("webhook fault delay: %w", err)
		}
		out.Delay = d
	}
	*f = out
	return nil
}

// validate reports why f cannot be injected, and fills in defaults.
func (f *HookFault) validate() error {
	if f.Count < 0 {
		return errors.New("webhook fault count must be >= 0")
	}
	switch f.Kind {
	case HookDuplicate, HookDropFirst:
	case HookShuffle:
		if f.Window == 0 {
			f.Window = defaultShuffleWindow
		}
		if f.Window < 2 {
			return errors.New("shuffle window must be >= 2")
		}
	case HookDelay:
		if f.Delay <= 0 {
			return errors.New("webhook delay fault needs a positive delay")
		}
	default:
		return fmt.Errorf("unknown webhook fault kind %q: want duplicate, shuffle, delay or drop_first", f.Kind)
	}
	return nil
}

// activeHookFault is an injected webhook fault and its remaining uses.
type activeHookFault struct {
	HookFault
	left int
}

// takeHook consumes one use of the first fault of kind that still applies.
func takeHook(faults []*activeHookFault, kind HookFaultKind) (HookFault, bool) {
	for _, f := range faults {
		if f.Kind != kind {
			continue
		}
		if f.Count == 0 {
			return f.HookFault, true
		}
		if f.left > 0 {
			f.left--
			return f.HookFault, true
		}
	}
	return HookFault{}, false
}

// peekHook returns the first fault of kind that still applies, unconsumed.
func peekHook(faults []*activeHookFault, kind HookFaultKind) (HookFault, bool) {
	for _, f := range faults {
		if f.Kind == kind && (f.Count == 0 || f.left > 0) {
			return f.HookFault, true
		}
	}
	return HookFault{}, false
}

// hooks is the webhook side of the Emulator. Fields after mu's comment are
// guarded by Emulator.mu.
type hooks struct {
	url, secret                      string
	initial, maxInterval, maxElapsed time.Duration
	client                           *http.Client

	// guarded by Emulator.mu
	events   []*emitted
	queue    []*emitted // emitted, not yet taken by the dispatcher
	held     []*emitted // in a shuffle window
	heldAt   time.Time  // when the last event joined the window
	faults   []*activeHookFault
	attempts []WebhookAttempt
	gen      uint64
	ctx      context.Context // canceled by Reset (deliveries of the old state) and Close
	cancel   context.CancelFunc

	wake       chan struct{} // a new event is queued
	stop       chan struct{} // closed by Close
	dispatcher sync.WaitGroup
	deliveries sync.WaitGroup
	rng        *rand.Rand // used by the dispatcher only
}

// initHooks sets the webhook defaults; New calls it before the options.
func (e *Emulator) initHooks() {
	e.hook.secret = DefaultWebhookSecret
	e.hook.initial = backoff.DefaultInitialInterval
	e.hook.maxInterval = time.Minute
	e.hook.maxElapsed = DefaultWebhookMaxElapsed
	e.hook.wake = make(chan struct{}, 1)
	e.hook.stop = make(chan struct{})
	e.hook.ctx, e.hook.cancel = context.WithCancel(context.Background())
	e.hook.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
}

// startHooks starts the dispatcher when a webhook URL is set; New calls it
// after the options.
func (e *Emulator) startHooks() {
	if e.hook.client == nil {
		e.hook.client = &http.Client{Timeout: webhookAttemptTimeout}
	}
	if e.hook.url == "" {
		return
	}
	e.hook.dispatcher.Add(1)
	go e.dispatch()
}

// closeHooks stops the dispatcher and every delivery; Close calls it
// without holding mu.
func (e *Emulator) closeHooks() {
	e.mu.Lock()
	select {
	case <-e.hook.stop:
	default:
		close(e.hook.stop)
	}
	e.hook.cancel()
	e.mu.Unlock()
	e.hook.dispatcher.Wait()
	e.hook.deliveries.Wait()
}

// resetHooksLocked forgets every event, attempt and fault and abandons the
// deliveries in progress; the caller holds mu.
func (e *Emulator) resetHooksLocked() {
	e.hook.cancel()
	e.hook.ctx, e.hook.cancel = context.WithCancel(context.Background())
	select {
	case <-e.hook.stop:
		e.hook.cancel() // closed: nothing is delivered any more
	default:
	}
	e.hook.gen++
	e.hook.events, e.hook.queue, e.hook.held, e.hook.faults, e.hook.attempts = nil, nil, nil, nil, nil
}

// emitLocked records an event of typ about object (its full Stripe JSON)
// and queues it for delivery; the caller holds mu.
func (e *Emulator) emitLocked(typ string, object []byte) {
	ev := event{ID: newID("evt"), Object: "event", APIVersion: stripe.APIVersion, Created: e.now().Unix(),
		Data: eventData{Object: object}, PendingWebhooks: 1, Type: typ}
	m := &emitted{WebhookEvent: WebhookEvent{ID: ev.ID, Type: typ, ObjectID: objIDOf(object), Status: "unsent"},
		payload: mustJSON(ev), gen: e.hook.gen}
	e.hook.events = append(e.hook.events, m)
	if e.hook.url == "" {
		return
	}
	select {
	case <-e.hook.stop:
		return
	default:
	}
	m.Status = "pending"
	e.hook.queue = append(e.hook.queue, m)
	select {
	case e.hook.wake <- struct{}{}:
	default:
	}
}

// dispatch moves queued events to delivery, through a shuffle window when a
// shuffle fault applies, until Close.
func (e *Emulator) dispatch() {
	defer e.hook.dispatcher.Done()
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	for {
		select {
		case <-e.hook.stop:
			return
		case <-e.hook.wake:
		case <-idle.C:
		}
		e.mu.Lock()
		var release []*emitted
		for _, m := range e.hook.queue {
			if f, ok := peekHook(e.hook.faults, HookShuffle); ok {
				m.Status = "held"
				e.hook.held = append(e.hook.held, m)
				e.hook.heldAt = time.Now()
				if len(e.hook.held) >= f.Window {
					takeHook(e.hook.faults, HookShuffle)
					release = append(release, e.shuffleHeldLocked()...)
				}
				continue
			}
			release = append(release, e.shuffleHeldLocked()...) // a window left over from a cleared fault
			release = append(release, m)
		}
		e.hook.queue = nil
		if len(e.hook.held) > 0 && time.Since(e.hook.heldAt) >= shuffleIdleFlush {
			takeHook(e.hook.faults, HookShuffle)
			release = append(release, e.shuffleHeldLocked()...)
		}
		if len(e.hook.held) > 0 {
			idle.Reset(shuffleIdleFlush)
		}
		for _, m := range release {
			e.startDeliveryLocked(m)
		}
		e.mu.Unlock()
	}
}

// shuffleHeldLocked empties the shuffle window in random order.
func (e *Emulator) shuffleHeldLocked() []*emitted {
	out := e.hook.held
	e.hook.held = nil
	e.hook.rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	for _, m := range out {
		m.Status = "pending"
	}
	return out
}

// startDeliveryLocked applies the per-event faults and starts delivering m
// (twice for a duplicate fault); the caller holds mu.
func (e *Emulator) startDeliveryLocked(m *emitted) {
	var delay time.Duration
	if f, ok := takeHook(e.hook.faults, HookDelay); ok {
		delay = f.Delay
	}
	_, dropFirst := takeHook(e.hook.faults, HookDropFirst)
	_, dup := takeHook(e.hook.faults, HookDuplicate)
	ctx := e.hook.ctx
	e.hook.deliveries.Add(1)
	go e.deliver(ctx, m, delay, dropFirst, false)
	if dup {
		e.hook.deliveries.Add(1)
		go e.deliver(ctx, m, delay, false, true)
	}
}

// errDropped is the error of an attempt a drop_first fault swallowed.
var errDropped = errors.New("attempt dropped by a drop_first fault")

// deliver POSTs m until a 2xx, resending with exponential backoff for at
// most the configured time (https://docs.stripe.com/webhooks#retries), or
// until ctx is done.
func (e *Emulator) deliver(ctx context.Context, m *emitted, delay time.Duration, dropFirst, duplicate bool) {
	defer e.hook.deliveries.Done()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	attempt := 0
	op := func() (struct{}, error) {
		attempt++
		a := WebhookAttempt{EventID: m.ID, Type: m.Type, Attempt: attempt, Duplicate: duplicate}
		var err error
		if attempt == 1 && dropFirst {
			a.Dropped, err = true, errDropped
		} else {
			a.Status, err = e.post(ctx, m.payload)
		}
		if err != nil {
			a.Error = err.Error()
		}
		a.At = time.Now()
		e.mu.Lock()
		if m.gen == e.hook.gen && ctx.Err() == nil {
			e.hook.attempts = append(e.hook.attempts, a)
			if err == nil {
				m.Status = "delivered"
			}
		}
		e.mu.Unlock()
		e.logger.Info("stripe emulator: webhook attempt", "event", m.ID, "type", m.Type, "attempt", attempt,
			"status", a.Status, "error", a.Error, "duplicate", duplicate)
		return struct{}{}, err
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = e.hook.initial, e.hook.maxInterval
	_, err := backoff.Retry(ctx, op, backoff.WithBackOff(bo), backoff.WithMaxElapsedTime(e.hook.maxElapsed))
	if err != nil && ctx.Err() == nil {
		e.mu.Lock()
		if m.gen == e.hook.gen && m.Status != "delivered" {
			m.Status = "failed"
		}
		e.mu.Unlock()
		e.logger.Warn("stripe emulator: webhook given up", "event", m.ID, "type", m.Type, "attempts", attempt, "error", err)
	}
}

// post sends one signed attempt and returns the status; a non-2xx status is
// an error.
func (e *Emulator) post(ctx context.Context, payload []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.hook.url, bytes.NewReader(payload))
	if err != nil {
		return 0, backoff.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	req.Header.Set("Stripe-Signature", Sign(payload, e.hook.secret, time.Now()))
	res, err := e.hook.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	_ = res.Body.Close()
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return res.StatusCode, fmt.Errorf("webhook endpoint answered %d", res.StatusCode)
	}
	return res.StatusCode, nil
}

// Sign returns the Stripe-Signature header for payload signed at t with
// secret: "t=<unix>,v1=<hex HMAC-SHA256 of "<unix>.<payload>">", Stripe's
// scheme (https://docs.stripe.com/webhooks#verify-manually), which stripe-go
// v76's webhook.ConstructEvent verifies. The key is the whole secret string,
// "whsec_" included.
func Sign(payload []byte, secret string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(payload)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// Webhooks returns the webhook log: every event since the last Reset and
// every delivery attempt.
func (e *Emulator) Webhooks() WebhookLog {
	e.mu.Lock()
	defer e.mu.Unlock()
	l := WebhookLog{URL: e.hook.url, Events: make([]WebhookEvent, 0, len(e.hook.events)),
		Attempts: append([]WebhookAttempt{}, e.hook.attempts...)}
	for _, m := range e.hook.events {
		l.Events = append(l.Events, m.WebhookEvent)
	}
	return l
}

// EventPayload returns the exact bytes of event id as delivered (signed
// over), or nil.
func (e *Emulator) EventPayload(id string) []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.hook.events {
		if m.ID == id {
			return append([]byte{}, m.payload...)
		}
	}
	return nil
}

// InjectWebhookFault adds a webhook fault, or returns why it is invalid.
func (e *Emulator) InjectWebhookFault(f HookFault) error {
	if err := f.validate(); err != nil {
		return err
	}
	e.mu.Lock()
	e.hook.faults = append(e.hook.faults, &activeHookFault{HookFault: f, left: f.Count})
	e.mu.Unlock()
	e.logger.Info("stripe emulator: webhook fault injected", "kind", f.Kind, "count", f.Count, "window", f.Window, "delay", f.Delay)
	return nil
}

// WebhookFaults returns the webhook faults that still apply, Count set to
// their remaining uses.
func (e *Emulator) WebhookFaults() []HookFault {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := []HookFault{}
	for _, f := range e.hook.faults {
		if f.Count > 0 && f.left == 0 {
			continue
		}
		g := f.HookFault
		if g.Count > 0 {
			g.Count = f.left
		}
		out = append(out, g)
	}
	return out
}

// ClearWebhookFaults removes every webhook fault; events held in a shuffle
// window are released with the next event or within a second.
func (e *Emulator) ClearWebhookFaults() {
	e.mu.Lock()
	e.hook.faults = nil
	if len(e.hook.held) > 0 {
		select {
		case e.hook.wake <- struct{}{}:
		default:
		}
	}
	e.mu.Unlock()
}

// getWebhooks serves GET /_emulator/webhooks: the WebhookLog.
func (e *Emulator) getWebhooks(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.Webhooks())
}

// postWebhookFaults serves POST /_emulator/webhooks/faults: one HookFault or
// an array; 204, or 400 {"error":…} (then none is added).
func (e *Emulator) postWebhookFaults(w http.ResponseWriter, r *http.Request) {
	faults, ok := decodeFaults[HookFault](w, r)
	if !ok {
		return
	}
	for _, f := range faults {
		_ = e.InjectWebhookFault(f) // validated
	}
	w.WriteHeader(http.StatusNoContent)
}

// getWebhookFaults serves GET /_emulator/webhooks/faults.
func (e *Emulator) getWebhookFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, e.WebhookFaults())
}

// deleteWebhookFaults serves DELETE /_emulator/webhooks/faults.
func (e *Emulator) deleteWebhookFaults(w http.ResponseWriter, _ *http.Request) {
	e.ClearWebhookFaults()
	w.WriteHeader(http.StatusNoContent)
}
