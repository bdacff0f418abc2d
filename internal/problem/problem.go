// Package problem renders errors as RFC 9457 problem details
// (application/problem+json): {"type","title","status","detail","code"} plus
// extension members such as "errors" or "order_id".
//
// Domain packages return an *Error, the one style of coded error: a Code
// (codes.go) with a detail and extension members, usually a package
// variable made with New, optionally wrapping its cause (Wrap); a
// validation_error is always Validation's. They never name an HTTP status
// and never render: this package's table maps each Code to its status,
// title and Retry-After, and Write, called by the edge (internal/api, and
// the idempotency layer for the responses it stores), is the one place
// where an error becomes an HTTP response. Any other error is a generic
// 500 that reveals nothing.
package problem

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// ContentType is the media type of a problem response (RFC 9457 section 3).
const ContentType = "application/problem+json"

// typeBase prefixes each code to form the problem's "type" URI.
const typeBase = "https://checkout.local/problems/"

// Problem is one rendered problem detail, as the client receives it: an
// *Error after the table gave it its status, title and Retry-After. Only
// this package builds one (internal/architecture holds every other package
// to that); it is an error so that a rendered problem passes through Write
// unchanged.
type Problem struct {
	Status int
	Code   string
	Title  string
	Detail string
	// RetryAfter, when positive, is sent as the Retry-After header (seconds).
	RetryAfter int
	// Extensions are extra members, e.g. "errors" or "order_id".
	Extensions map[string]any
}

// Error returns the detail, or the title when there is none.
func (p *Problem) Error() string {
	if p.Detail != "" {
		return p.Code + ": " + p.Detail
	}
	return p.Code + ": " + p.Title
}

// With returns a copy of p with one more extension member.
func (p *Problem) With(name string, value any) *Problem {
	q := *p
	q.Extensions = make(map[string]any, len(p.Extensions)+1)
	for k, v := range p.Extensions {
		q.Extensions[k] = v
	}
	q.Extensions[name] = value
	return &q
}

// MarshalJSON encodes the problem with the RFC 9457 members first and the
// extensions after them, in a stable order (encoding/json sorts map keys).
func (p *Problem) MarshalJSON() ([]byte, error) {
	members := map[string]any{
		"type":   typeBase + p.Code,
		"title":  p.Title,
		"status": p.Status,
		"code":   p.Code,
	}
	if p.Detail != "" {
		members["detail"] = p.Detail
	}
	for k, v := range p.Extensions {
		if _, taken := members[k]; !taken {
			members[k] = v
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(members); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// Body returns the problem's JSON encoding.
func (p *Problem) Body() []byte {
	b, err := p.MarshalJSON()
	if err != nil {
		// Extensions are plain values built by this service; failing here
		// is a programming error.
		panic("problem: encode: " + err.Error())
	}
	return b
}

// Error is a coded error: what a domain package returns for an answer the
// client must see. It names a Code, never an HTTP status; Write renders it
// through the table. The cause, for the log only, is attached with Wrap.
// An *Error is not changed once made: With and WithRetryAfter copy.
type Error struct {
	// Code is one of the Code constants.
	Code Code
	// Detail is a sentence for people about this occurrence; empty sends
	// no "detail".
	Detail string
	// RetryAfter, when positive, replaces the code's Retry-After (seconds).
	RetryAfter int
	// Extensions are extra members, e.g. "errors" or "order_id".
	Extensions map[string]any
}

// New returns the coded error code with detail.
func New(code Code, detail string) *Error {
	return &Error{Code: code, Detail: detail}
}

// Error returns "code: detail", or "code: title" without a detail.
func (e *Error) Error() string {
	if e.Detail != "" {
		return string(e.Code) + ": " + e.Detail
	}
	return string(e.Code) + ": " + table[e.Code].Title
}

// With returns a copy of e with one more extension member.
func (e *Error) With(name string, value any) *Error {
	f := *e
	f.Extensions = make(map[string]any, len(e.Extensions)+1)
	for k, v := range e.Extensions {
		f.Extensions[k] = v
	}
	f.Extensions[name] = value
	return &f
}

// WithRetryAfter returns a copy of e whose Retry-After is seconds instead
// of the code's.
func (e *Error) WithRetryAfter(seconds int) *Error {
	f := *e
	f.RetryAfter = seconds
	return &f
}

// Problem renders e through the table; a code the table lacks (a
// programming error) renders as Internal.
func (e *Error) Problem() *Problem {
	spec, ok := table[e.Code]
	if !ok {
		return Internal
	}
	p := &Problem{Status: spec.Status, Code: string(spec.wire(e.Code)), Title: spec.Title, Detail: e.Detail,
		RetryAfter: spec.RetryAfter, Extensions: e.Extensions}
	if e.RetryAfter > 0 {
		p.RetryAfter = e.RetryAfter
	}
	return p
}

// rendered is what From looks for in an error's chain: an *Error or an
// already rendered *Problem.
type rendered interface{ problem() *Problem }

func (e *Error) problem() *Problem   { return e.Problem() }
func (p *Problem) problem() *Problem { return p }

// Internal is the problem every unexpected error becomes.
var Internal = &Problem{Status: table[CodeInternal].Status, Code: string(CodeInternal), Title: table[CodeInternal].Title,
	Detail: "The server failed to handle the request. It is safe to retry with the same Idempotency-Key."}

// Wrap returns an error that is e for errors.Is, errors.As and From, and
// that also wraps cause, so the cause can be logged while the client sees
// only e.
func Wrap(e *Error, cause error) error {
	return &wrapped{e: e, cause: cause}
}

type wrapped struct {
	e     *Error
	cause error
}

func (w *wrapped) Error() string   { return string(w.e.Code) + ": " + w.cause.Error() }
func (w *wrapped) Unwrap() []error { return []error{w.e, w.cause} }

// From returns the problem err renders as: the first *Error (through the
// table) or *Problem in its chain, or Internal.
func From(err error) *Problem {
	var r rendered
	if errors.As(err, &r) {
		return r.problem()
	}
	return Internal
}

// Write writes err as a problem response and reports whether it was a known
// problem (false means the caller should log err: it became a 500).
func Write(w http.ResponseWriter, err error) (known bool) {
	p := From(err)
	h := w.Header()
	h.Set("Content-Type", ContentType)
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	w.WriteHeader(p.Status)
	w.Write(p.Body())
	return p != Internal
}
