package stripeemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// FaultKind names what a Fault does to the requests it applies to.
type FaultKind string

// The fault kinds. FaultFail applies to any authenticated /v1 request on
// arrival; FaultDelay and FaultDrop apply only to requests that execute (create
// or retrieve a PaymentIntent), never to replays, 409s or validation errors.
const (
	// FaultFail answers with Fault.Status (default 500) and a Stripe api_error
	// body without executing anything, so nothing is stored under the
	// idempotency key, as with a Stripe 5xx that happened before the endpoint
	// ran.
	FaultFail FaultKind = "fail"
	// FaultDelay sleeps Fault.Before before executing (the idempotency key is
	// already claimed, so a concurrent request with the same key gets 409) and
	// Fault.After after executing and storing the result (so a client that
	// times out has still been charged).
	FaultDelay FaultKind = "delay"
	// FaultDrop executes and stores the result, then closes the connection
	// without writing a response.
	FaultDrop FaultKind = "drop"
)

// Fault is one injected failure rule. Faults of one kind apply in the order
// they were injected; a request consumes at most one fault of each kind.
//
// Its JSON form, accepted by POST /_emulator/faults, is
//
//	{"kind":"fail","count":2,"status":503}
//	{"kind":"delay","count":1,"before":"500ms","after":"2s"}
//	{"kind":"drop","count":1}
//
// with durations in time.ParseDuration syntax.
type Fault struct {
	// Kind is what the fault does.
	Kind FaultKind
	// Count is how many requests the fault applies to. Zero means every
	// request until ClearFaults or Reset.
	Count int
	// Status is the HTTP status a FaultFail answers with, 400..599; zero
	// means 500. 429 answers with Stripe's rate_limit error.
	Status int
	// Before is how long a FaultDelay sleeps before executing.
	Before time.Duration
	// After is how long a FaultDelay sleeps after executing, before writing
	// the response.
	After time.Duration
}

// faultJSON is the wire form of Fault.
type faultJSON struct {
	Kind   FaultKind `json:"kind"`
	Count  int       `json:"count,omitempty"`
	Status int       `json:"status,omitempty"`
	Before string    `json:"before,omitempty"`
	After  string    `json:"after,omitempty"`
}

// MarshalJSON encodes f in the form POST /_emulator/faults accepts.
func (f Fault) MarshalJSON() ([]byte, error) {
	j := faultJSON{Kind: f.Kind, Count: f.Count, Status: f.Status}
	if f.Before > 0 {
		j.Before = f.Before.String()
	}
	if f.After > 0 {
		j.After = f.After.String()
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
	out := Fault{Kind: j.Kind, Count: j.Count, Status: j.Status}
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
	*f = out
	return nil
}

// validate reports why f cannot be injected, and fills in defaults.
func (f *Fault) validate() error {
	if f.Count < 0 {
		return errors.New("fault count must be >= 0")
	}
	switch f.Kind {
	case FaultFail:
		if f.Status == 0 {
			f.Status = 500
		}
		if f.Status < 400 || f.Status > 599 {
			return fmt.Errorf("fault status %d: want 400..599", f.Status)
		}
	case FaultDelay:
		if f.Before < 0 || f.After < 0 || f.Before+f.After == 0 {
			return errors.New("delay fault needs a positive before or after")
		}
	case FaultDrop:
	default:
		return fmt.Errorf("unknown fault kind %q: want fail, delay or drop", f.Kind)
	}
	return nil
}

// activeFault is an injected fault and how many requests it still applies to.
type activeFault struct {
	Fault
	left int // remaining requests; unused when Count is 0
}

// take returns the first fault of kind that still applies and consumes one
// use of it. The caller holds the emulator's lock.
func take(faults []*activeFault, kind FaultKind) (Fault, bool) {
	for _, f := range faults {
		if f.Kind != kind {
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
}

// name is the label written into the request log.
func (x execFaults) name() string {
	switch {
	case x.drop && x.before+x.after > 0:
		return "delay+drop"
	case x.drop:
		return string(FaultDrop)
	case x.before+x.after > 0:
		return string(FaultDelay)
	}
	return ""
}
