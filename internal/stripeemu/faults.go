package stripeemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// FaultKind names what a Fault does to the requests it applies to.
type FaultKind string

// The fault kinds. FaultFail applies to any authenticated /v1 request on
// arrival; FaultStored500 to POST requests whose parameters passed
// validation; FaultDelay and FaultDrop only to requests that execute, never
// to replays, 409s or validation errors.
const (
	// FaultFail answers with Fault.Status (default 500) and a Stripe error
	// body without executing anything, so nothing is stored under the
	// idempotency key, as with a Stripe 5xx that happened before the endpoint
	// ran, a 429 (rate_limit, or Fault.Code "lock_timeout") or a 503: Stripe
	// stores none of these (https://docs.stripe.com/api/idempotent_requests:
	// results are saved only once an endpoint began executing;
	// https://docs.stripe.com/rate-limits for 429 and lock_timeout).
	FaultFail FaultKind = "fail"
	// FaultDelay sleeps Fault.Before before executing (the idempotency key is
	// already claimed, so a concurrent request with the same key gets 409) and
	// Fault.After after executing and storing the result (so a client that
	// times out has still been charged).
	FaultDelay FaultKind = "delay"
	// FaultDrop executes and stores the result, then closes the connection
	// without writing a response.
	FaultDrop FaultKind = "drop"
	// FaultStored500 answers 500 api_error once the endpoint began executing
	// and stores that 500 under the request's idempotency key, so every retry
	// with the key gets the same 500, byte for byte, until the key is pruned:
	// Stripe "saves the status code and body of the first request made with a
	// given idempotency key after endpoint execution begins. Retries with the
	// same key return the saved response, including 500 errors"
	// (https://docs.stripe.com/api/idempotent_requests). A 500's outcome is
	// indeterminate and Stripe may complete the request later
	// (https://docs.stripe.com/error-low-level#server-errors): with
	// Fault.RollForward set, the request is executed for real that long after
	// the 500 (0: at once, before the 500 is answered); with RollForward nil
	// it never runs. It applies to POST requests only.
	FaultStored500 FaultKind = "stored_500"
	// FaultDecline makes a confirm that executes (op pi.confirm) decline the
	// card, whatever its payment method, as Stripe's test card
	// pm_card_chargeDeclined does: 402 card_error card_declined /
	// generic_decline, and the PaymentIntent back in requires_payment_method
	// with last_payment_error set, open for another attempt ("If the payment
	// attempt fails (for example due to a decline), the PaymentIntent's
	// status returns to requires_payment_method",
	// https://docs.stripe.com/payments/paymentintents/lifecycle). It never
	// applies to a stored 500's roll-forward, which executes what the
	// original request asked.
	FaultDecline FaultKind = "decline"
)

// The operations a Fault can be limited to with Fault.Op.
const (
	OpPICreate       = "pi.create"
	OpPIConfirm      = "pi.confirm"
	OpPICancel       = "pi.cancel"
	OpPIUpdate       = "pi.update"
	OpPIRetrieve     = "pi.retrieve"
	OpPISearch       = "pi.search"
	OpPIList         = "pi.list"
	OpRefundCreate   = "refund.create"
	OpRefundRetrieve = "refund.retrieve"
	OpRefundList     = "refund.list"
	OpChargeRetrieve = "charge.retrieve"
)

// ops lists every valid Fault.Op.
var ops = []string{OpPICreate, OpPIConfirm, OpPICancel, OpPIUpdate, OpPIRetrieve, OpPISearch, OpPIList,
	OpRefundCreate, OpRefundRetrieve, OpRefundList, OpChargeRetrieve}

// Fault is one injected failure rule. Faults of one kind apply in the order
// they were injected; a request consumes at most one fault of each kind.
//
// Its JSON form, accepted by POST /_emulator/faults, is
//
//	{"kind":"fail","count":2,"status":503}
//	{"kind":"fail","count":1,"status":429,"code":"lock_timeout","op":"pi.confirm"}
//	{"kind":"delay","count":1,"before":"500ms","after":"2s"}
//	{"kind":"drop","count":1,"op":"pi.create"}
//	{"kind":"stored_500","count":1,"op":"pi.create"}
//	{"kind":"stored_500","count":1,"op":"pi.confirm","roll_forward":"2s"}
//	{"kind":"decline","count":1,"op":"pi.confirm"}
//
// with durations in time.ParseDuration syntax.
type Fault struct {
	// Kind is what the fault does.
	Kind FaultKind
	// Op limits the fault to one operation (one of the Op* constants, e.g.
	// "pi.confirm"); "" applies it to every request its kind applies to.
	Op string
	// Count is how many requests the fault applies to. Zero means every
	// request until ClearFaults or Reset.
	Count int
	// Status is the HTTP status a FaultFail answers with, 400..599; zero
	// means 500. 429 answers with Stripe's rate_limit error.
	Status int
	// Code is the error code a FaultFail answers with: "" for Stripe's
	// default for Status (rate_limit for 429, none for 5xx), or
	// "lock_timeout" (only with Status 429).
	Code string
	// Before is how long a FaultDelay sleeps before executing.
	Before time.Duration
	// After is how long a FaultDelay sleeps after executing, before writing
	// the response.
	After time.Duration
	// RollForward, for a FaultStored500 only, is how long after the 500 the
	// request is executed for real; nil means never. RollForwardAfter builds
	// one.
	RollForward *time.Duration
}

// RollForwardAfter returns &d, for Fault.RollForward.
func RollForwardAfter(d time.Duration) *time.Duration { return &d }

// faultJSON is the wire form of Fault.
type faultJSON struct {
	Kind        FaultKind `json:"kind"`
	Op          string    `json:"op,omitempty"`
	Count       int       `json:"count,omitempty"`
	Status      int       `json:"status,omitempty"`
	Code        string    `json:"code,omitempty"`
	Before      string    `json:"before,omitempty"`
	After       string    `json:"after,omitempty"`
	RollForward *string   `json:"roll_forward,omitempty"`
}

// MarshalJSON encodes f in the form POST /_emulator/faults accepts.
func (f Fault) MarshalJSON() ([]byte, error) {
	j := faultJSON{Kind: f.Kind, Op: f.Op, Count: f.Count, Status: f.Status, Code: f.Code}
	if f.Before > 0 {
		j.Before = f.Before.String()
	}
	if f.After > 0 {
		j.After = f.After.String()
	}
	if f.RollForward != nil {
		s := f.RollForward.String()
		j.RollForward = &s
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes the form shown on Fault. It does not validate; Inject
// does.
func (f *Fault) UnmarshalJSON(data []byte) error {
	var j faultJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	out := Fault{Kind: j.Kind, Op: j.Op, Count: j.Count, Status: j.Status, Code: j.Code}
	var err error
	if j.Before != "" {
		if out.Before, err = time.ParseDuration(j.Before); err != nil {
			return fmt.Errorf("fault before: %w", err)
		}
	}
	if j.After != "" {
		if out.After, err = time.ParseDuration(j.After); err != nil {
			return fmt.Errorf("fault after: %w", err)
		}
	}
	if j.RollForward != nil {
		d, err := time.ParseDuration(*j.RollForward)
		if err != nil {
			return fmt.Errorf("fault roll_forward: %w", err)
		}
		out.RollForward = &d
	}
	*f = out
	return nil
}

// validate reports why f cannot be injected, and fills in defaults.
func (f *Fault) validate() error {
	if f.Count < 0 {
		return errors.New("fault count must be >= 0")
	}
	if f.Op != "" && !slices.Contains(ops, f.Op) {
		return fmt.Errorf("unknown fault op %q: want one of %v", f.Op, ops)
	}
	if f.RollForward != nil && (f.Kind != FaultStored500 || *f.RollForward < 0) {
		return errors.New("roll_forward needs kind stored_500 and a duration >= 0")
	}
	if f.Code != "" && (f.Kind != FaultFail || f.Code != "lock_timeout") {
		return fmt.Errorf("fault code %q: only \"lock_timeout\" with kind fail and status 429", f.Code)
	}
	switch f.Kind {
	case FaultFail:
		if f.Status == 0 {
			f.Status = 500
		}
		if f.Status < 400 || f.Status > 599 {
			return fmt.Errorf("fault status %d: want 400..599", f.Status)
		}
		if f.Code == "lock_timeout" && f.Status != 429 {
			return errors.New("code lock_timeout needs status 429")
		}
	case FaultDelay:
		if f.Before < 0 || f.After < 0 || f.Before+f.After == 0 {
			return errors.New("delay fault needs a positive before or after")
		}
	case FaultDrop, FaultStored500:
	case FaultDecline:
		if f.Op != "" && f.Op != OpPIConfirm {
			return fmt.Errorf("decline fault op %q: only %q confirms", f.Op, OpPIConfirm)
		}
	default:
		return fmt.Errorf("unknown fault kind %q: want fail, delay, drop, stored_500 or decline", f.Kind)
	}
	return nil
}

// activeFault is an injected fault and how many requests it still applies to.
type activeFault struct {
	Fault
	left int // remaining requests; unused when Count is 0
}

// take returns the first fault of kind that applies to op and still applies,
// and consumes one use of it. The caller holds the emulator's lock.
func take(faults []*activeFault, kind FaultKind, op string) (Fault, bool) {
	for _, f := range faults {
		if f.Kind != kind || (f.Op != "" && f.Op != op) {
			continue
		}
		if f.Count == 0 {
			return f.Fault, true
		}
		if f.left > 0 {
			f.left--
			return f.Fault, true
		}
	}
	return Fault{}, false
}

// execFaults is what applies to one executing request.
type execFaults struct {
	before, after time.Duration
	drop          bool
	decline       bool
}

// name is the label written into the request log.
func (x execFaults) name() string {
	switch {
	case x.decline:
		return string(FaultDecline)
	case x.drop && x.before+x.after > 0:
		return "delay+drop"
	case x.drop:
		return string(FaultDrop)
	case x.before+x.after > 0:
		return string(FaultDelay)
	}
	return ""
}
