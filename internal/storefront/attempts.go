package storefront

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
)

// Attempt is one HTTP request the storefront sent to the API for a
// browser's request, and its answer, as the panel shows it.
type Attempt struct {
	// Pay is the Pay of the purchase the attempt belongs to, from 1.
	Pay int `json:"pay"`
	// N counts the attempts of one call from 1.
	N int `json:"n"`
	// IdempotencyKey is the key the request carried.
	IdempotencyKey string `json:"idempotency_key"`
	// Status is the answer's HTTP status, 0 when no answer came.
	Status int `json:"status"`
	// Code is the problem's code of an error answer, e.g.
	// "idempotency_key_in_use".
	Code string `json:"code,omitempty"`
	// Replayed is the answer's Idempotent-Replayed: true.
	Replayed bool `json:"replayed"`
	// Error says why no answer came (a reset connection, a timeout).
	Error string `json:"error,omitempty"`
	// TraceURL is the Pay's trace in the trace UI (Config.TraceUI), when
	// one is configured and the Pay was traced.
	TraceURL string `json:"trace_url,omitempty"`
}

// attemptLog collects the attempts of one browser request; the recording
// transport finds it in the request's context.
type attemptLog struct {
	mu       sync.Mutex
	attempts []Attempt
}

type attemptLogKey struct{}

// withAttemptLog returns ctx carrying a new log.
func withAttemptLog(ctx context.Context) (context.Context, *attemptLog) {
	l := &attemptLog{}
	return context.WithValue(ctx, attemptLogKey{}, l), l
}

// list returns the attempts so far.
func (l *attemptLog) list() []Attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Attempt{}, l.attempts...)
}

// recorder is the http.RoundTripper of the storefront's API client: it
// notes each attempt the client package makes (its retries are otherwise
// invisible to the caller) in the request's attemptLog.
type recorder struct{ next http.RoundTripper }

// RoundTrip sends req and records it with its answer.
func (rt recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	l, _ := req.Context().Value(attemptLogKey{}).(*attemptLog)
	resp, err := rt.next.RoundTrip(req)
	if l == nil || req.Header.Get("Idempotency-Key") == "" {
		return resp, err
	}
	a := Attempt{IdempotencyKey: req.Header.Get("Idempotency-Key")}
	if err != nil {
		a.Error = err.Error()
	} else {
		a.Status = resp.StatusCode
		a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		if resp.StatusCode >= 300 {
			// Peek at the problem's code; the client reads the body after.
			body, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			if rerr != nil {
				a.Error = rerr.Error()
			}
			var p struct {
				Code string `json:"code"`
			}
			_ = json.Unmarshal(body, &p)
			a.Code = p.Code
		}
	}
	l.mu.Lock()
	a.N = len(l.attempts) + 1
	l.attempts = append(l.attempts, a)
	l.mu.Unlock()
	return resp, err
}
