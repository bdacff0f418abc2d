//go:build model

package model

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"pgregory.net/rapid"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// failer is what a history needs of its test: *testing.T (a pasted
// history) and *rapid.T (a generated one) both are one.
type failer interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// history is one generated sequence of actions against the shared stack,
// with what the model knows: every key it sent and every answer it got.
// Its keys and its buyers' emails start with prefix, so its orders are
// told apart from the other histories' in the shared database.
type history struct {
	t      failer
	s      *stack.Stack
	prefix string
	keys   []*key
	// steps are the actions taken so far, as Go statements (the printer).
	steps []string
	// stopped names the processes a step left stopped.
	stopped  map[string]bool
	mailDown bool
	client   *http.Client
	// failedSucceeded: Stripe failed a refund that had succeeded. The
	// order's status, which never goes back, may then be ahead of what
	// Stripe's refunds say.
	failedSucceeded bool
	// deadBefore is the number of dead letters recorded when the history
	// began.
	deadBefore int
}

// keyKind is the route a key was sent on.
type keyKind int

const (
	checkoutKey keyKind = iota
	cancelKey
	refundKey
)

// key is one Idempotency-Key of the history and what the model expects of
// it: once it has a final answer, every request with the same body sent
// before finalSent+IDEMPOTENCY_TTL replays that answer byte for byte.
type key struct {
	kind  keyKind
	value string
	path  string
	body  []byte
	// changed is the same request with another body (another quantity), for
	// the retries that must get 422 while the key is kept.
	changed []byte
	// email is the checkout's buyer, unique to the key: the orders with it
	// are the orders this key made.
	email string
	// order is the order a cancel or refund key is about.
	order string
	// final is the key's first final answer in its current epoch, sent at
	// finalSent.
	final     *answer
	finalSent time.Time
	// epochs counts the times the key may have made a new order or refund:
	// 1, plus 1 for every request sent after its retention ended.
	epochs int
	// made lists the objects (order ids, refund ids) its answers named.
	made map[string]bool
	// finishedAt is when the service finished the key, as its row last
	// showed it (observeKeys): the completer may finish a key whose client
	// never got the answer, and its retention counts from then.
	finishedAt time.Time
	// firstSent is when the key was first sent in its current epoch: the
	// earliest its service could have finished it.
	firstSent time.Time
}

// answer is one HTTP answer; status 0 is no answer at all.
type answer struct {
	status   int
	code     string
	replayed bool
	body     []byte
	id       string // the order's or the refund's id in the body
	orderID  string // a problem's order_id
	err      error
}

// final reports whether the client must not retry a: a stored outcome or a
// request error. 409 in use, 429, 5xx and no answer are retried.
func (a answer) final() bool {
	switch {
	case a.status == 0, a.status >= 500, a.status == http.StatusTooManyRequests:
		return false
	case a.status == http.StatusConflict:
		return a.code != "idempotency_key_in_use"
	}
	return true
}

func (a answer) String() string {
	if a.status == 0 {
		return fmt.Sprintf("no answer (%v)", a.err)
	}
	return fmt.Sprintf("%d %s replayed=%v %s", a.status, a.code, a.replayed, bytes.TrimSpace(a.body))
}

// newHistory starts a history on s: every process running, every Stripe,
// webhook and mail fault gone, a fresh prefix.
func newHistory(t failer, s *stack.Stack) *history {
	t.Helper()
	h := &history{t: t, s: s, prefix: fmt.Sprintf("m%d%s-", histories.Add(1), time.Now().Format("150405")),
		stopped: map[string]bool{}, client: &http.Client{Timeout: 30 * time.Second}}
	s.ClearFaults()
	s.ClearHookFaults()
	s.MailRestore()
	for _, p := range h.procs() {
		if !p.Running() {
			if err := p.Start(); err != nil {
				t.Fatalf("start %s: %v", p.Name, err)
			}
		}
	}
	h.deadBefore = h.deadLetters()
	return h
}

func (h *history) procs() []*stack.Process {
	return []*stack.Process{h.s.API, h.s.Worker, h.s.Dispatcher}
}

// record adds a step to the printed history.
func (h *history) record(format string, args ...any) {
	h.steps = append(h.steps, fmt.Sprintf(format, args...))
	h.t.Logf("step %d: %s", len(h.steps), h.steps[len(h.steps)-1])
}

// fail reports the broken invariant inv, with what broke it (ids of
// this run) and the history so far as a Go test to paste into this
// package; rapid prints the one of the shrunk history. The failure itself
// names only inv: rapid shrinks a history only while it fails with the
// same message, and ids differ from run to run.
func (h *history) fail(inv invariant, format string, args ...any) {
	h.t.Helper()
	h.t.Logf("after %d steps: "+format, append([]any{len(h.steps)}, args...)...)
	h.t.Logf("the history as a Go test (paste it into tests/model):\n%s", h.goTest())
	h.t.Fatalf("invariant broken: %s", inv)
}

// invariant names one of the rules the model checks (docs/testing.md,
// "Invariants").
type invariant string

// The invariants, as fail reports them.
const (
	invOneOrder         invariant = "a key makes at most one order per retention period"
	invMadeOnce         invariant = "a key's answers name at most one order or refund per retention period"
	invReplay           invariant = "a key replays its final answer byte for byte until IDEMPOTENCY_TTL after it"
	invReused422        invariant = "a key sent with another body gets 422 while it is kept"
	invOneCharge        invariant = "at most one PaymentIntent per order moves money"
	invRefundOnce       invariant = "each refund request refunds once"
	invRefundWithinPaid invariant = "refunds never exceed what was paid"
	invKeyFinishes      invariant = "every key reaches a final answer"
	invAtRest           invariant = "every order reaches a final status and every paid order's email leaves"
	invMoneyOnlyForPaid invariant = "money moves only for orders paid or refunded from paid"
	invRefundedAsStripe invariant = "an order's amount_refunded and status are what Stripe refunded"
	invOneEmail         invariant = "each paid order gets one email with one Message-ID"
	invNoDeadLetter     invariant = "no event is dead-lettered"
)

// goTest prints the history as a test function of this package.
func (h *history) goTest() string {
	var b strings.Builder
	b.WriteString("func TestModelHistory(t *testing.T) {\n\th := newHistory(t, startStack(t))\n")
	for _, s := range h.steps {
		b.WriteString("\th." + s + "\n")
	}
	b.WriteString("\th.quiesce()\n}\n")
	return b.String()
}

// actions are the history's rapid actions: each draws its parameters and
// calls the method of the same name, which records itself and checks the
// invariants. A draw that finds nothing to act on skips.
func (h *history) actions() map[string]func(*rapid.T) {
	orderIdx := func(t *rapid.T) int {
		n := len(h.orders())
		if n == 0 {
			t.Skip("no order yet")
		}
		return rapid.IntRange(0, n-1).Draw(t, "order")
	}
	keyIdx := func(t *rapid.T, kind keyKind) int {
		var idx []int
		for i, k := range h.keys {
			if k.kind == kind {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			t.Skip("no key yet")
		}
		return rapid.SampledFrom(idx).Draw(t, "key")
	}
	return map[string]func(*rapid.T){
		"Checkout": func(t *rapid.T) {
			h.Checkout(rapid.SampledFrom(skus).Draw(t, "sku"), rapid.IntRange(1, 2).Draw(t, "quantity"),
				rapid.SampledFrom(paymentMethods).Draw(t, "payment_method"))
		},
		"Retry": func(t *rapid.T) {
			h.Retry(keyIdx(t, checkoutKey), rapid.Bool().Draw(t, "changed"))
		},
		"RetryUntilFinal": func(t *rapid.T) {
			h.RetryUntilFinal(rapid.IntRange(0, max(len(h.keys)-1, 0)).Draw(t, "key"))
		},
		"Cancel":            func(t *rapid.T) { h.Cancel(orderIdx(t)) },
		"RetryCancel":       func(t *rapid.T) { h.RetryKey(keyIdx(t, cancelKey)) },
		"Refund":            func(t *rapid.T) { h.Refund(orderIdx(t), rapid.SampledFrom(refundAmounts).Draw(t, "amount")) },
		"RetryRefund":       func(t *rapid.T) { h.RetryKey(keyIdx(t, refundKey)) },
		"ConcurrentRefunds": func(t *rapid.T) { h.ConcurrentRefunds(orderIdx(t)) },
		"StripeFault": func(t *rapid.T) {
			h.StripeFault(rapid.SampledFrom(faultNames).Draw(t, "fault"))
		},
		"StripeDown":   func(t *rapid.T) { h.StripeFault(rapid.SampledFrom(downFaults).Draw(t, "fault")) },
		"ClearFaults":  func(*rapid.T) { h.ClearFaults() },
		"Authenticate": func(t *rapid.T) { h.Authenticate(orderIdx(t), rapid.Bool().Draw(t, "succeed")) },
		"DashboardCancel": func(t *rapid.T) {
			h.DashboardCancel(orderIdx(t), rapid.SampledFrom(cancellationReasons).Draw(t, "reason"))
		},
		"DashboardRefund": func(t *rapid.T) {
			h.DashboardRefund(orderIdx(t), rapid.SampledFrom([]int64{500, 1000, 2500}).Draw(t, "amount"))
		},
		"Crash": func(t *rapid.T) {
			h.Crash(rapid.SampledFrom([]string{"api", "worker", "dispatcher"}).Draw(t, "process"))
		},
		"CrashDuringCheckout": func(t *rapid.T) {
			h.CrashDuringCheckout(rapid.SampledFrom([]string{"api", "worker", "dispatcher"}).Draw(t, "process"),
				rapid.IntRange(0, 400).Draw(t, "after_ms"))
		},
		"WorkerBacklog": func(t *rapid.T) { h.WorkerBacklog(rapid.IntRange(3, 8).Draw(t, "orders")) },
		"PassTime": func(t *rapid.T) {
			h.PassTime(windows[rapid.IntRange(0, len(windows)-1).Draw(t, "window")].name)
		},
		"Mail":        func(t *rapid.T) { h.Mail(rapid.Bool().Draw(t, "down")) },
		"FailRefunds": func(t *rapid.T) { h.FailRefunds(orderIdx(t)) },
	}
}

// The values actions draw from.
var (
	skus           = []string{"sku_tee", "sku_mug", "sku_hoodie"}
	paymentMethods = []string{"pm_card_visa", "pm_card_visa", "pm_card_visa", "pm_card_chargeDeclined",
		"pm_card_authenticationRequired", "pm_card_unknownToStripe"}
	// refundAmounts: 0 is "the rest" (no amount), -1 more than the order's
	// total, others partial amounts in cents.
	refundAmounts = []int64{1000, 2000, 0, -1}
	// cancellationReasons are Stripe's for a PaymentIntent
	// (https://docs.stripe.com/api/payment_intents/cancel#cancel_payment_intent-cancellation_reason).
	cancellationReasons = []string{"duplicate", "fraudulent", "requested_by_customer", "abandoned"}
)

// faults are the Stripe faults action StripeFault injects, by name.
var faults = map[string][]stripeemu.Fault{
	"stored 500 on create":                {{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate, Count: 1}},
	"stored 500 on confirm":               {{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPIConfirm, Count: 1}},
	"stored 500 on create rolled":         {{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate, Count: 1, RollForward: stripeemu.RollForwardAfter(500 * time.Millisecond)}},
	"stored 500 on confirm rolled":        {{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPIConfirm, Count: 1, RollForward: stripeemu.RollForwardAfter(2 * time.Second)}},
	"stored 500 on confirm, then decline": {{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPIConfirm, Count: 1, RollForward: stripeemu.RollForwardAfter(2 * time.Second)}, {Kind: stripeemu.FaultDecline, Op: stripeemu.OpPIConfirm, Count: 1}},
	"stored 500 on refund":                {{Kind: stripeemu.FaultStored500, Op: stripeemu.OpRefundCreate, Count: 1}},
	"stored 500 on refund rolled":         {{Kind: stripeemu.FaultStored500, Op: stripeemu.OpRefundCreate, Count: 1, RollForward: stripeemu.RollForwardAfter(8 * time.Second)}},
	"429":                                 {{Kind: stripeemu.FaultFail, Status: 429, Count: 2}},
	"503":                                 {{Kind: stripeemu.FaultFail, Status: 503, Count: 2}},
	"decline":                             {{Kind: stripeemu.FaultDecline, Op: stripeemu.OpPIConfirm, Count: 1}},
	"slow answer":                         {{Kind: stripeemu.FaultDelay, Count: 1, After: 1500 * time.Millisecond}},
	"dropped answer":                      {{Kind: stripeemu.FaultDrop, Count: 1}},
	"401 until cleared":                   {{Kind: stripeemu.FaultFail, Status: 401}},
	"outage until cleared":                {{Kind: stripeemu.FaultFail, Status: 503}},
	"dropped confirm":                     {{Kind: stripeemu.FaultDrop, Op: stripeemu.OpPIConfirm, Count: 1}},
}

// downFaults are the faults action StripeDown draws from, Stripe down
// until ClearFaults: our secret key refused (401, a rolled or revoked key),
// or every request failing, GETs included (an outage). StripeFault does
// not draw them, so that a history draws one as often as any other action:
// the windows matter most while one lasts.
var downFaults = []string{"401 until cleared", "outage until cleared"}

// faultNames are the keys of faults, sorted, for drawing.
var faultNames = func() []string {
	var ns []string
	for n := range faults {
		if !slices.Contains(downFaults, n) {
			ns = append(ns, n)
		}
	}
	sortStrings(ns)
	return ns
}()

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// checkoutBody is the JSON of a checkout of quantity sku for email.
func checkoutBody(email, sku string, quantity int, pm string) []byte {
	b, _ := json.Marshal(map[string]any{"email": email, "items": []map[string]any{{"sku": sku, "quantity": quantity}},
		"payment_method": pm})
	return b
}

// Checkout sends a new checkout under a new key, once.
func (h *history) Checkout(sku string, quantity int, pm string) {
	h.t.Helper()
	h.record("Checkout(%q, %d, %q)", sku, quantity, pm)
	n := len(h.keys)
	email := fmt.Sprintf("%sk%d@example.com", h.prefix, n)
	k := &key{kind: checkoutKey, value: fmt.Sprintf("%sk%d", h.prefix, n), path: "/v1/checkouts", email: email,
		body: checkoutBody(email, sku, quantity, pm), changed: checkoutBody(email, sku, quantity+1, pm),
		epochs: 1, made: map[string]bool{}}
	h.keys = append(h.keys, k)
	h.send(k, false)
	h.check()
}

// Retry sends key i again, with its body or with a changed one.
func (h *history) Retry(i int, changed bool) {
	h.t.Helper()
	h.record("Retry(%d, %v)", i, changed)
	if i < len(h.keys) {
		h.send(h.keys[i], changed)
	}
	h.check()
}

// RetryKey sends key i again with its body (a cancel's or a refund's).
func (h *history) RetryKey(i int) {
	h.t.Helper()
	h.record("RetryKey(%d)", i)
	if i < len(h.keys) {
		h.send(h.keys[i], false)
	}
	h.check()
}

// RetryUntilFinal sends key i with its body until a final answer, for at
// most 5s (a fault may still be on: then it stops without one).
func (h *history) RetryUntilFinal(i int) {
	h.t.Helper()
	h.record("RetryUntilFinal(%d)", i)
	if i < len(h.keys) {
		h.untilFinal(h.keys[i], 5*time.Second)
	}
	h.check()
}

func (h *history) untilFinal(k *key, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if h.send(k, false).final() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Cancel cancels order i under a new key (POST /v1/orders/{id}/cancel).
func (h *history) Cancel(i int) {
	h.t.Helper()
	h.record("Cancel(%d)", i)
	if o, ok := h.order(i); ok {
		k := &key{kind: cancelKey, value: fmt.Sprintf("%sk%d", h.prefix, len(h.keys)), path: "/v1/orders/" + o.id + "/cancel",
			body: []byte("{}"), order: o.id, epochs: 1, made: map[string]bool{}}
		h.keys = append(h.keys, k)
		h.send(k, false)
	}
	h.check()
}

// Refund refunds order i under a new key: amount cents, 0 for the rest,
// -1 for more than its total.
func (h *history) Refund(i int, amount int64) {
	h.t.Helper()
	h.record("Refund(%d, %d)", i, amount)
	if o, ok := h.order(i); ok {
		h.send(h.refundKey(o, amount), false)
	}
	h.check()
}

func (h *history) refundKey(o orderRow, amount int64) *key {
	body := `{"reason":"requested_by_customer"}`
	switch {
	case amount > 0:
		body = fmt.Sprintf(`{"amount":%d,"reason":"requested_by_customer"}`, amount)
	case amount < 0:
		body = fmt.Sprintf(`{"amount":%d,"reason":"requested_by_customer"}`, o.total+100)
	}
	k := &key{kind: refundKey, value: fmt.Sprintf("%sk%d", h.prefix, len(h.keys)), path: "/v1/orders/" + o.id + "/refunds",
		body: []byte(body), order: o.id, epochs: 1, made: map[string]bool{}}
	h.keys = append(h.keys, k)
	return k
}

// ConcurrentRefunds sends two refunds of order i at once under two keys,
// each of a little more than half of its total: at most one may succeed.
func (h *history) ConcurrentRefunds(i int) {
	h.t.Helper()
	h.record("ConcurrentRefunds(%d)", i)
	if o, ok := h.order(i); ok {
		a, b := h.refundKey(o, o.total/2+100), h.refundKey(o, o.total/2+100)
		var wg sync.WaitGroup
		var ra, rb answer
		wg.Add(2)
		sent := time.Now()
		go func() { defer wg.Done(); ra = h.post(a.path, a.value, a.body) }()
		go func() { defer wg.Done(); rb = h.post(b.path, b.value, b.body) }()
		wg.Wait()
		h.observe(a, false, sent, ra)
		h.observe(b, false, sent, rb)
	}
	h.check()
}

// StripeFault injects the Stripe fault named name (faults).
func (h *history) StripeFault(name string) {
	h.t.Helper()
	h.record("StripeFault(%q)", name)
	h.s.Fault(faults[name]...)
	h.check()
}

// ClearFaults removes every Stripe fault still on.
func (h *history) ClearFaults() {
	h.t.Helper()
	h.record("ClearFaults()")
	h.s.ClearFaults()
	h.check()
}

// Authenticate plays the 3D Secure challenge of order i's PaymentIntent,
// passed or failed; the emulator refuses it for one not in requires_action.
func (h *history) Authenticate(i int, succeed bool) {
	h.t.Helper()
	h.record("Authenticate(%d, %v)", i, succeed)
	if o, ok := h.order(i); ok {
		for _, pi := range h.intents()[o.id] {
			_ = h.s.TryAuthenticate(pi.ID, succeed)
		}
	}
	h.check()
}

// DashboardCancel cancels order i's open PaymentIntents with reason as
// support does in Stripe's Dashboard: POST /v1/payment_intents/{id}/cancel
// with cancellation_reason (https://docs.stripe.com/api/payment_intents/cancel),
// our secret key, no idempotency key of ours.
func (h *history) DashboardCancel(i int, reason string) {
	h.t.Helper()
	h.record("DashboardCancel(%d, %q)", i, reason)
	if o, ok := h.order(i); ok {
		for _, pi := range h.intents()[o.id] {
			switch pi.Status {
			case "succeeded", "canceled":
				continue
			}
			h.stripe("/v1/payment_intents/"+pi.ID+"/cancel", url.Values{"cancellation_reason": {reason}})
		}
	}
	h.check()
}

// DashboardRefund refunds amount cents of order i's succeeded
// PaymentIntent as the Dashboard does: POST /v1/refunds with
// payment_intent and amount (https://docs.stripe.com/api/refunds/create),
// no metadata of ours. Stripe refuses more than is left.
func (h *history) DashboardRefund(i int, amount int64) {
	h.t.Helper()
	h.record("DashboardRefund(%d, %d)", i, amount)
	if o, ok := h.order(i); ok {
		for _, pi := range h.intents()[o.id] {
			if pi.Status == "succeeded" {
				h.stripe("/v1/refunds", url.Values{"payment_intent": {pi.ID}, "amount": {strconv.FormatInt(amount, 10)}})
			}
		}
	}
	h.check()
}

// FailRefunds makes Stripe fail every refund of order i's PaymentIntents
// that has not failed yet, as a bank that refuses one does (failure_reason
// expired_or_canceled_card, https://docs.stripe.com/refunds#failed-refunds),
// through the emulator's POST /_emulator/refunds/{id}/fail.
func (h *history) FailRefunds(i int) {
	h.t.Helper()
	h.record("FailRefunds(%d)", i)
	if o, ok := h.order(i); ok {
		pis := map[string]bool{}
		for _, pi := range h.intents()[o.id] {
			pis[pi.ID] = true
		}
		for _, rf := range h.s.RefundsAtStripe() {
			if pis[rf.PaymentIntent] && rf.Status != "failed" {
				h.failedSucceeded = h.failedSucceeded || rf.Status == "succeeded"
				resp, err := h.client.Post(h.s.EmulatorURL+"/_emulator/refunds/"+rf.ID+"/fail", "application/json",
					strings.NewReader(`{"failure_reason":"expired_or_canceled_card"}`))
				if err != nil {
					h.t.Fatalf("fail refund %s: %v", rf.ID, err)
				}
				resp.Body.Close()
			}
		}
	}
	h.check()
}

// Crash SIGKILLs the process named name and starts it again.
func (h *history) Crash(name string) {
	h.t.Helper()
	h.record("Crash(%q)", name)
	for _, p := range h.procs() {
		if p.Name == name {
			p.Kill()
			if err := p.Start(); err != nil {
				h.t.Fatalf("restart %s: %v", name, err)
			}
		}
	}
	h.check()
}

// CrashDuringCheckout sends a new checkout (a card that pays) and
// SIGKILLs the process named name afterMS milliseconds later, while the
// checkout may be anywhere in its steps, then starts it again.
func (h *history) CrashDuringCheckout(name string, afterMS int) {
	h.t.Helper()
	h.record("CrashDuringCheckout(%q, %d)", name, afterMS)
	n := len(h.keys)
	email := fmt.Sprintf("%sk%d@example.com", h.prefix, n)
	k := &key{kind: checkoutKey, value: fmt.Sprintf("%sk%d", h.prefix, n), path: "/v1/checkouts", email: email,
		body: checkoutBody(email, "sku_tee", 1, "pm_card_visa"), changed: checkoutBody(email, "sku_tee", 2, "pm_card_visa"),
		epochs: 1, made: map[string]bool{}}
	h.keys = append(h.keys, k)
	sent := time.Now()
	done := make(chan answer, 1)
	go func() { done <- h.post(k.path, k.value, k.body) }()
	time.Sleep(time.Duration(afterMS) * time.Millisecond)
	for _, p := range h.procs() {
		if p.Name == name {
			p.Kill()
			if err := p.Start(); err != nil {
				h.t.Fatalf("restart %s: %v", name, err)
			}
		}
	}
	h.observe(k, false, sent, <-done)
	h.check()
}

// WorkerBacklog stops the worker, sends n checkouts once (the events of
// those paid wait in the queue), then starts the worker and kills it at once five times, as a
// crash loop or a rolling redeploy does, and starts it for good.
func (h *history) WorkerBacklog(n int) {
	h.t.Helper()
	h.record("WorkerBacklog(%d)", n)
	h.s.Worker.Stop()
	for range n {
		email := fmt.Sprintf("%sk%d@example.com", h.prefix, len(h.keys))
		k := &key{kind: checkoutKey, value: fmt.Sprintf("%sk%d", h.prefix, len(h.keys)), path: "/v1/checkouts", email: email,
			body: checkoutBody(email, "sku_mug", 1, "pm_card_visa"), changed: checkoutBody(email, "sku_mug", 2, "pm_card_visa"),
			epochs: 1, made: map[string]bool{}}
		h.keys = append(h.keys, k)
		// Once: with Stripe down they are paid later, by the completer.
		h.send(k, false)
	}
	// The dispatcher publishes the backlog (OUTBOX_POLL_INTERVAL=200ms).
	deadline := time.Now().Add(10 * time.Second)
	for h.s.Unpublished() > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	for range 5 {
		if err := h.s.Worker.Start(); err != nil {
			h.t.Fatalf("start worker: %v", err)
		}
		h.s.Worker.Kill()
	}
	if err := h.s.Worker.Start(); err != nil {
		h.t.Fatalf("start worker: %v", err)
	}
	h.check()
}

// PassTime lets the window named name (windows) pass, and 300ms more.
func (h *history) PassTime(name string) {
	h.t.Helper()
	h.record("PassTime(%q)", name)
	for _, w := range windows {
		if w.name == name {
			// Watching the keys meanwhile: one the completer finishes
			// and the reaper deletes within the window is seen finished.
			for end := time.Now().Add(w.d + 300*time.Millisecond); time.Now().Before(end); {
				time.Sleep(100 * time.Millisecond)
				h.observeKeys()
			}
		}
	}
	h.check()
}

// Mail takes the mail server down (451 to every message) or brings it
// back.
func (h *history) Mail(down bool) {
	h.t.Helper()
	h.record("Mail(%v)", down)
	if down {
		h.s.MailOutage("reject", 451)
	} else {
		h.s.MailRestore()
	}
	h.mailDown = down
	h.check()
}

// send sends key k once (its changed body if changed) and checks the
// answer against what the key answered before.
func (h *history) send(k *key, changed bool) answer {
	h.t.Helper()
	body := k.body
	if changed && k.changed != nil {
		body = k.changed
	}
	sent := time.Now()
	a := h.post(k.path, k.value, body)
	h.observe(k, changed && k.changed != nil, sent, a)
	return a
}

// retentionSlack covers the clocks of the processes and the transport:
// a request sent that close to the end of a key's retention may find it
// kept or gone.
const retentionSlack = 300 * time.Millisecond

// observe checks answer a to key k, sent at sent, against the key's
// earlier answers, and records it. A key replays its final answer byte for
// byte until IDEMPOTENCY_TTL after it (the server finished it after sent,
// so sent+TTL is a lower bound); a changed body in that time gets 422 or a
// transient answer, never an outcome.
func (h *history) observe(k *key, changed bool, sent time.Time, a answer) {
	h.t.Helper()
	if k.expiredAt(sent) {
		if a.replayed {
			// Past its retention but not reaped yet: still the old key,
			// whose answer the service may give or not.
			return
		}
		// Retention over: the key may be gone and run as new.
		k.final, k.finishedAt, k.firstSent, k.epochs = nil, time.Time{}, time.Time{}, k.epochs+1
	}
	if k.firstSent.IsZero() {
		k.firstSent = sent
	}
	if a.id != "" {
		k.made[a.id] = true
	} else if a.orderID != "" && k.kind == checkoutKey {
		// A checkout's problem (402) names the order it made; a refund's
		// or a cancel's names the order it is about.
		k.made[a.orderID] = true
	}
	if len(k.made) > k.epochs {
		h.fail(invMadeOnce, "key %s (%s) made %d objects %v in %d retention periods; last answer %s", k.value, k.path, len(k.made), keys(k.made), k.epochs, a)
	}
	switch {
	case changed && a.final() && a.status != http.StatusUnprocessableEntity && k.final == nil && len(k.made) == 0:
		// The key was never claimed (its requests were refused before,
		// e.g. Redis down): the changed body is the key's request now.
		k.body, k.changed = k.changed, k.body
		k.final, k.finalSent = &a, sent
	case changed:
		if a.final() && a.status != http.StatusUnprocessableEntity {
			h.fail(invReused422, "key %s sent with another body got %s, want 422 idempotency_key_reused", k.value, a)
		}
	case k.final != nil:
		if a.final() && (a.status != k.final.status || !bytes.Equal(a.body, k.final.body) || !a.replayed) {
			h.fail(invReplay, "key %s within IDEMPOTENCY_TTL of its final answer:\nfirst: %s\nnow:   %s", k.value, k.final, a)
		}
		// No answer at all, or the gateway's 504, says nothing of the key.
		if !a.final() && a.status != 0 && a.status != http.StatusGatewayTimeout {
			h.fail(invReplay, "key %s within IDEMPOTENCY_TTL of its final answer %s answered %s", k.value, k.final, a)
		}
	case a.final() && a.status != http.StatusUnprocessableEntity && a.status != http.StatusBadRequest:
		k.final, k.finalSent = &a, sent
	}
}

// expiredAt reports whether k's retention may have ended by sent: it
// began when the client got the final answer (finalSent, a lower bound of
// the finish) or when the service finished the key (finishedAt), whichever
// is known first.
//
// A first final answer that is already a replay was finished before, by a
// request whose answer was lost or by the completer, at a time the model
// may not have seen (a finish and a reap within one long step): its
// retention may have begun as early as the key's first send.
func (k *key) expiredAt(sent time.Time) bool {
	start := k.finalSent
	if k.final != nil && k.final.replayed {
		start = k.firstSent
	}
	if k.final == nil || (!k.finishedAt.IsZero() && k.finishedAt.Before(start)) {
		start = k.finishedAt
	}
	if k.final == nil && k.finishedAt.IsZero() {
		return false
	}
	return sent.After(start.Add(ttl - retentionSlack))
}

// observeKeys reads when the service finished each key of the history
// (idempotency_keys.finished_at), read-only.
func (h *history) observeKeys() {
	h.t.Helper()
	rows, err := h.s.DB.Query(context.Background(),
		`SELECT key, finished_at FROM idempotency_keys WHERE key LIKE $1 AND finished_at IS NOT NULL`, h.prefix+"%")
	if err != nil {
		h.t.Fatalf("keys: %v", err)
	}
	defer rows.Close()
	byValue := map[string]*key{}
	for _, k := range h.keys {
		byValue[k.value] = k
	}
	for rows.Next() {
		var v string
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			h.t.Fatalf("keys: %v", err)
		}
		if k := byValue[v]; k != nil && k.finishedAt.IsZero() {
			k.finishedAt = at
		}
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}

// post sends one POST to the api through the gateway.
func (h *history) post(path, idemKey string, body []byte) answer {
	c := stack.Client{BaseURL: h.s.Gateway.URL, APIKey: "sk_test_acme", HTTP: h.client}
	r := c.Post(context.Background(), path, idemKey, body)
	a := answer{status: r.Status, code: r.Code, body: r.Body, err: r.Err, replayed: r.Replayed}
	var p struct {
		ID      string `json:"id"`
		OrderID string `json:"order_id"`
	}
	if r.Status != 0 && json.Unmarshal(r.Body, &p) == nil {
		a.orderID = p.OrderID
		if r.Status < 300 && !strings.HasSuffix(path, "/cancel") {
			a.id = p.ID
		}
	}
	return a
}

// stripe calls Stripe's API at the emulator as the Dashboard would, with
// the account's secret key; Stripe's refusal (a 400 for a PaymentIntent
// that cannot be canceled, a refund over what is left) is part of the
// history, not a failure.
func (h *history) stripe(path string, form url.Values) {
	req, _ := http.NewRequest(http.MethodPost, h.s.EmulatorURL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Authorization", "Bearer sk_test_123")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Logf("dashboard %s: %v", path, err)
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	h.t.Logf("dashboard %s: %s %s", path, resp.Status, bytes.TrimSpace(b))
}

// orderRow is an order of the history as the database has it.
type orderRow struct {
	id     string
	status orders.Status
	total  int64
	email  string
}

// orders returns the history's orders in the order they were made.
func (h *history) orders() []orderRow {
	rows, err := h.s.DB.Query(context.Background(),
		`SELECT id, status, amount_total, email FROM orders WHERE email LIKE $1 ORDER BY created_at, id`, h.prefix+"%")
	if err != nil {
		h.t.Fatalf("orders: %v", err)
	}
	defer rows.Close()
	var out []orderRow
	for rows.Next() {
		var o orderRow
		if err := rows.Scan(&o.id, &o.status, &o.total, &o.email); err != nil {
			h.t.Fatalf("orders: %v", err)
		}
		out = append(out, o)
	}
	return out
}

func (h *history) order(i int) (orderRow, bool) {
	os := h.orders()
	if i < 0 || i >= len(os) {
		return orderRow{}, false
	}
	return os[i], true
}

// intents returns the emulator's PaymentIntents by metadata[order_id].
func (h *history) intents() map[string][]stack.PaymentIntent {
	return stack.IntentsByOrder(h.s.PaymentIntents())
}
