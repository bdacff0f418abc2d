// Package problem renders errors as RFC 9457 problem details
// (application/problem+json): {"type","title","status","detail","code"} plus
// extension members such as "errors" or "order_id".
//
// Domain code returns *Problem values (or errors wrapping them); this package
// is the one place where an error becomes an HTTP response. Any other error
// is a generic 500 that reveals nothing.
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

// Problem is one problem detail. Code is the stable, machine-readable name
// clients switch on; Status is the HTTP status code.
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

// New returns a problem with the given status, code, title and detail.
func New(status int, code, title, detail string) *Problem {
	return &Problem{Status: status, Code: code, Title: title, Detail: detail}
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

// Internal is the problem every unexpected error becomes.
var Internal = New(http.StatusInternalServerError, "internal", "Internal server error",
	"The server failed to handle the request. It is safe to retry with the same Idempotency-Key.")

// Wrap returns an error that is p for errors.As and problem.From, and that
// also wraps cause, so the cause can be logged while the client sees only p.
func Wrap(p *Problem, cause error) error {
	return &wrapped{p: p, cause: cause}
}

type wrapped struct {
	p     *Problem
	cause error
}

func (w *wrapped) Error() string   { return w.p.Code + ": " + w.cause.Error() }
func (w *wrapped) Unwrap() []error { return []error{w.p, w.cause} }

// From returns the *Problem that err is or wraps, or Internal.
func From(err error) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
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
