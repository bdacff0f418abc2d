package idempotency

import (
	"net/http"
	"strconv"
	"time"

	"github.com/onceonly/checkout/internal/problem"
)

// Response is a final response stored under a key and replayed byte for byte.
type Response struct {
	// Status is the HTTP status code.
	Status int `json:"status"`
	// Header holds the headers that are part of the outcome, e.g.
	// Content-Type and Location. Never Set-Cookie or anything secret:
	// responses are replayed.
	Header map[string]string `json:"header"`
	// Body is the exact response body.
	Body []byte `json:"body"`
	// ExpiresAt is when the key's retention ends: IDEMPOTENCY_TTL after the
	// key finished (its final answer), not after it was first claimed.
	ExpiresAt time.Time `json:"expires_at"`
}

// JSONResponse returns a Response with a JSON body and optional Location.
func JSONResponse(status int, body []byte, location string) *Response {
	h := map[string]string{"Content-Type": "application/json"}
	if location != "" {
		h["Location"] = location
	}
	return &Response{Status: status, Header: h, Body: body}
}

// ProblemResponse returns a Response carrying e as problem+json, rendered
// through the problem table.
func ProblemResponse(e *problem.Error) *Response {
	p := e.Problem()
	h := map[string]string{"Content-Type": problem.ContentType}
	if p.RetryAfter > 0 {
		h["Retry-After"] = strconv.Itoa(p.RetryAfter)
	}
	return &Response{Status: p.Status, Header: h, Body: p.Body()}
}

// Write sends r; replayed adds Idempotent-Replayed: true.
func (r *Response) Write(w http.ResponseWriter, replayed bool) {
	h := w.Header()
	for k, v := range r.Header {
		h.Set(k, v)
	}
	if replayed {
		h.Set(ReplayedHeader, "true")
	}
	w.WriteHeader(r.Status)
	w.Write(r.Body)
}
