package client

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RetryPolicy decides how a call waits between attempts. The zero value
// of a field means its default (DefaultRetryPolicy).
//
// The wait before attempt n+1 (n ≥ 1) is "full jitter" backoff, a random
// duration in [0, min(MaxDelay, BaseDelay·2^(n-1))], so that clients that
// failed together do not come back together. An answer with Retry-After
// (RFC 9110 section 10.2.3: delay-seconds or an HTTP-date) is never retried
// sooner than it asks: the wait is then Retry-After plus a jitter in
// [0, BaseDelay]. Retry-After is not capped by MaxDelay: the service (409
// in use, 429, 503) knows better than the client when trying again can
// work.
//
// Retrying stops at the first of: a final answer; the context being done;
// a wait that would end after the context's deadline (the call returns the
// last answer at once instead of sleeping in vain, with Stopped
// context.DeadlineExceeded); MaxAttempts attempts. Without a deadline on
// the context, MaxElapsed bounds the whole call.
type RetryPolicy struct {
	// BaseDelay is the first backoff's upper bound (default 100ms).
	BaseDelay time.Duration
	// MaxDelay caps the backoff's upper bound (default 5s).
	MaxDelay time.Duration
	// MaxAttempts is the most HTTP requests of one call (default 0: no
	// limit but the deadline).
	MaxAttempts int
	// MaxElapsed bounds a call whose context has no deadline (default 1m),
	// as if the context had one.
	MaxElapsed time.Duration
	// AttemptTimeout bounds one HTTP request (default 30s), so that an
	// answer that never comes (a stalled connection) becomes a transport
	// error that is retried, within the call's deadline.
	AttemptTimeout time.Duration

	// Sleep waits d or until ctx is done, returning ctx.Err() then. Tests
	// inject it to record the waits without sleeping. Default: a timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now is the clock, for HTTP-date Retry-After values and the
	// deadline. Default: time.Now.
	Now func() time.Time
	// Jitter returns a random float in [0, 1). Default: math/rand/v2.
	Jitter func() float64
}

// DefaultRetryPolicy returns the policy used when none is given: backoff
// from 100ms capped at 5s, no attempt limit, calls bounded by 1m without a
// context deadline, attempts by 30s.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		BaseDelay:      100 * time.Millisecond,
		MaxDelay:       5 * time.Second,
		MaxElapsed:     time.Minute,
		AttemptTimeout: 30 * time.Second,
		Sleep:          sleep,
		Now:            time.Now,
		Jitter:         rand.Float64,
	}
}

// withDefaults fills the zero fields of p from DefaultRetryPolicy.
func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy()
	if p.BaseDelay <= 0 {
		p.BaseDelay = d.BaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = d.MaxDelay
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = d.MaxElapsed
	}
	if p.AttemptTimeout <= 0 {
		p.AttemptTimeout = d.AttemptTimeout
	}
	if p.Sleep == nil {
		p.Sleep = d.Sleep
	}
	if p.Now == nil {
		p.Now = d.Now
	}
	if p.Jitter == nil {
		p.Jitter = d.Jitter
	}
	return p
}

// Backoff returns the wait before the attempt after attempt n (n ≥ 1)
// when the answer named no Retry-After: full jitter under
// min(MaxDelay, BaseDelay·2^(n-1)).
func (p RetryPolicy) Backoff(n int) time.Duration {
	p = p.withDefaults()
	return time.Duration(p.Jitter() * float64(p.ceiling(n)))
}

// ceiling is the upper bound of Backoff(n).
func (p RetryPolicy) ceiling(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	c := float64(p.BaseDelay) * math.Pow(2, float64(n-1))
	if c > float64(p.MaxDelay) {
		return p.MaxDelay
	}
	return time.Duration(c)
}

// wait returns the wait after attempt n whose answer asked for retryAfter
// (0: none).
func (p RetryPolicy) wait(n int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return retryAfter + time.Duration(p.Jitter()*float64(p.BaseDelay))
	}
	return time.Duration(p.Jitter() * float64(p.ceiling(n)))
}

// transient reports whether an answer is retried with the same key:
// status 0 (no answer), 409 idempotency_key_in_use, 429, 502, 503 and 504.
// None of them is stored under the key (CONTRACT.md, Idempotency
// semantics), so a retry either resumes or replays the operation.
func transient(status int, code Code) bool {
	switch status {
	case 0, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	case http.StatusConflict:
		return code == CodeIdempotencyKeyInUse
	}
	return false
}

// parseRetryAfter reads a Retry-After value (RFC 9110 section 10.2.3):
// delay-seconds, or an HTTP-date taken relative to now. It returns 0 for
// an absent, malformed or past value.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(math.MaxInt64/time.Second) {
			return math.MaxInt64
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
