package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/httpbody"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/telemetry"
)

// FailureMode is what the gateway does when Redis does not answer
// (DEDUP_FAILURE_MODE).
type FailureMode string

const (
	// FailClosed answers 503 unavailable: nothing executes without both
	// layers. The default for checkouts.
	FailClosed FailureMode = "closed"
	// FailOpen goes on with the Postgres layer alone, which still allows
	// one execution per key; only the shield against a duplicate storm is lost.
	FailOpen FailureMode = "open"
)

// ParseFailureMode parses "closed" or "open".
func ParseFailureMode(s string) (FailureMode, error) {
	switch m := FailureMode(s); m {
	case FailClosed, FailOpen:
		return m, nil
	}
	return "", fmt.Errorf("want closed or open, got %q", s)
}

// Config configures the Gateway.
type Config struct {
	// Lease is how long a claim stays exclusive without extension
	// (IDEMPOTENCY_LEASE, default 30s); it is extended every Lease/3 while
	// the request runs.
	Lease time.Duration
	// TTL is how long a finished key is replayed (IDEMPOTENCY_TTL, 24h).
	TTL time.Duration
	// FailureMode decides what happens when Redis fails.
	FailureMode FailureMode
	// WorkTimeout bounds a request's work, which runs on a context detached
	// from the client connection (default 60s).
	WorkTimeout time.Duration
	// MaxBodyBytes is the largest accepted body (64 KiB).
	MaxBodyBytes int64
}

// Gateway is the idempotency layer in front of a route's handler: it checks
// the request, takes the Redis lease, keeps the leases alive while the
// handler runs, and caches the final response.
type Gateway struct {
	Config  Config
	Leases  *Leases
	Store   *Store
	DB      *gorm.DB
	Logger  *slog.Logger
	Metrics *Metrics
	// Tenant returns the authenticated tenant of a request.
	Tenant func(*gin.Context) string

	mu     sync.Mutex
	routes []string // what Middleware guards, in the order it was asked
}

// Routes returns the routes Middleware was asked to guard: every route
// whose requests take an Idempotency-Key, and so whose unfinished keys a
// completer must be able to resume.
func (g *Gateway) Routes() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.routes)
}

// Request is what the gateway hands the route's handler, through RequestOf.
type Request struct {
	Scope       Scope
	Fingerprint string
	// Owner is the lease token of this execution, for Store's fenced writes.
	Owner string
	// Body is the RFC 8785 canonical form of the request body, read once by
	// the gateway. Handlers decode this form, so that every body with the
	// same fingerprint is decoded the same way (2.0 and 2 alike).
	Body []byte

	outcome string
	final   *Response
}

const requestKey = "idempotency.request"

// RequestOf returns the Request the gateway stored, or nil on a route
// without the gateway.
func RequestOf(c *gin.Context) *Request {
	r, _ := c.Get(requestKey)
	req, _ := r.(*Request)
	return req
}

// Respond writes a final response (one that is stored under the key) and
// has the gateway cache it in Redis for replays.
func (r *Request) Respond(w http.ResponseWriter, resp *Response, replayed bool) {
	r.final = resp
	if replayed {
		r.outcome = OutcomeReplayed
	} else {
		r.outcome = OutcomeNew
	}
	resp.Write(w, replayed)
}

// Fail writes err as a problem response that is not stored, and reports
// whether it was a known problem (false: it became a 500 to be logged).
func (r *Request) Fail(w http.ResponseWriter, err error) bool {
	switch {
	case errors.Is(err, ErrKeyInUse), errors.Is(err, ErrLeaseLost):
		r.outcome = OutcomeInUse
	case errors.Is(err, ErrKeyReused):
		r.outcome = OutcomeReused
	default:
		r.outcome = OutcomeFailed
	}
	return problem.Write(w, err)
}

// MiddlewareOption changes how Middleware admits a request.
type MiddlewareOption func(*middlewareOptions)

type middlewareOptions struct {
	emptyBodyIsObject bool
}

// EmptyBodyIsObject admits an empty body as the JSON object {} (for routes
// whose body is optional, such as POST /v1/orders/{id}/cancel) instead of
// answering 400 malformed_json, and a request with neither a body nor a
// Content-Type instead of answering 415.
func EmptyBodyIsObject(o *middlewareOptions) { o.emptyBodyIsObject = true }

// Middleware guards route (the method and route template, e.g. "POST
// /v1/checkouts" or "POST /v1/orders/{id}/cancel": the key's scope). The
// request's path takes part in its fingerprint when it is not the template
// itself, so the same key sent for another order is 422, never that order's
// replay. It answers, in the contract's order and without storing
// anything: 415 unsupported_media_type, 413 payload_too_large, 400
// idempotency_key_missing / idempotency_key_invalid, 400 malformed_json; then
// from Redis: a cached replay, 422 idempotency_key_reused, 409
// idempotency_key_in_use, or 503 unavailable when Redis fails in closed mode.
// Otherwise it runs the handler on a context detached from the client, with
// the leases extended until the handler returns.
func (g *Gateway) Middleware(route string, opts ...MiddlewareOption) gin.HandlerFunc {
	var o middlewareOptions
	for _, f := range opts {
		f(&o)
	}
	g.Metrics.expose(route)
	g.mu.Lock()
	g.routes = append(g.routes, route)
	g.mu.Unlock()
	return func(c *gin.Context) {
		req, err := g.admit(c, route, o)
		if err != nil {
			g.reject(c, route, err)
			return
		}

		// The work must not die with the client's connection: a client that
		// times out retries, and its retry resumes or replays this work.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), g.Config.WorkTimeout)
		defer cancel()
		// Logs name the key by a hash of its scope, never by its value.
		ctx = telemetry.WithAttrs(ctx, slog.String("key_hash", req.Scope.Hash()[:16]))

		redisHeld := true
		acq, err := g.acquire(ctx, req)
		switch {
		case err != nil:
			g.Metrics.redisError(g.Config.FailureMode)
			if g.Config.FailureMode != FailOpen {
				g.Logger.WarnContext(ctx, "redis unavailable; refusing (DEDUP_FAILURE_MODE=closed)", "err", err)
				g.reject(c, route, ErrUnavailable)
				return
			}
			g.Logger.WarnContext(ctx, "redis unavailable; continuing on postgres alone (DEDUP_FAILURE_MODE=open)", "err", err)
			redisHeld = false
		case acq.Cached != nil:
			g.Metrics.duplicate("redis")
			if acq.CachedFingerprint != req.Fingerprint {
				g.reject(c, route, ErrKeyReused)
				return
			}
			g.Metrics.outcome(route, OutcomeReplayed)
			acq.Cached.Write(c.Writer, true)
			c.Abort()
			return
		case !acq.Acquired:
			g.Metrics.duplicate("redis")
			if acq.HolderFingerprint != "" && acq.HolderFingerprint != req.Fingerprint {
				g.reject(c, route, ErrKeyReused)
				return
			}
			g.reject(c, route, ErrKeyInUse)
			return
		}

		c.Request = c.Request.WithContext(ctx)
		c.Set(requestKey, req)

		stop := g.keepLease(ctx, req, redisHeld)
		c.Next()
		stop()

		// Bookkeeping after the response: short, detached, best effort.
		bg, cancelBG := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancelBG()
		if req.final != nil {
			if req.outcome == OutcomeReplayed {
				g.Metrics.duplicate("postgres")
			}
		} else if req.outcome == OutcomeInUse || req.outcome == OutcomeReused {
			g.Metrics.duplicate("postgres")
		}
		switch {
		case req.final != nil && redisHeld: // the usual end: one round trip
			if _, err := g.Leases.Settle(bg, req.Scope, req.Fingerprint, req.Owner, req.final, g.Store.Now()); err != nil {
				g.Logger.WarnContext(bg, "cache response and release lease in redis", "err", err)
			}
		case req.final != nil:
			if err := g.Leases.Cache(bg, req.Scope, req.Fingerprint, req.final, g.Store.Now()); err != nil {
				g.Logger.WarnContext(bg, "cache response in redis", "err", err)
			}
		case redisHeld:
			if _, err := g.Leases.Release(bg, req.Scope, req.Fingerprint, req.Owner); err != nil {
				g.Logger.WarnContext(bg, "release redis lease", "err", err)
			}
		}
		if req.outcome == "" {
			req.outcome = OutcomeFailed
		}
		g.Metrics.outcome(route, req.outcome)
	}
}

// Cached reports whether the request, by its Idempotency-Key header alone
// (the body is not read), has a finished response in the Redis replay
// cache for route: one EXISTS, so the rate limiter can give replays a
// bucket of their own before any idempotency work. A missing or invalid
// key, or a Redis error, is false: the request counts as a first execution.
func (g *Gateway) Cached(c *gin.Context, route string) bool {
	key, err := KeyFromHeader(c.Request.Header)
	if err != nil {
		return false
	}
	ok, err := g.Leases.Cached(c.Request.Context(), Scope{Tenant: g.Tenant(c), Route: route, Key: key})
	return err == nil && ok
}

// errBodyUnreadable answers a request whose body could not be read whole.
var errBodyUnreadable = problem.New(problem.CodeMalformedJSON,
	"The request body ended early or arrived too slowly; send it whole, at once.")

// checkContentType accepts exactly one Content-Type, application/json, in
// UTF-8 (RFC 8259 section 8.1: JSON exchanged between systems is UTF-8), and
// no Content-Encoding: anything else is 415.
func checkContentType(h http.Header) error {
	types := h.Values("Content-Type")
	if len(types) != 1 {
		return ErrUnsupportedMediaType
	}
	mediaType, params, err := mime.ParseMediaType(types[0])
	if err != nil || mediaType != "application/json" {
		return ErrUnsupportedMediaType
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return ErrUnsupportedMediaType
	}
	if enc := h.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return ErrUnsupportedMediaType
	}
	return nil
}

// acquire is Leases.Acquire, except that a cached response whose retention
// has ended by the gateway's clock is dropped and the lease taken instead:
// past IDEMPOTENCY_TTL the key is new, whatever Redis still holds.
func (g *Gateway) acquire(ctx context.Context, req *Request) (Acquisition, error) {
	acq, err := g.Leases.Acquire(ctx, req.Scope, req.Fingerprint, req.Owner, g.Config.Lease)
	if err != nil || acq.Cached == nil || acq.Cached.ExpiresAt.After(g.Store.Now()) {
		return acq, err
	}
	if err := g.Leases.Forget(ctx, req.Scope); err != nil {
		return Acquisition{}, err
	}
	return g.Leases.Acquire(ctx, req.Scope, req.Fingerprint, req.Owner, g.Config.Lease)
}

// admit runs the checks that need no state: media type, size, key, JSON.
func (g *Gateway) admit(c *gin.Context, route string, o middlewareOptions) (*Request, error) {
	noBody := c.Request.ContentLength == 0 && len(c.Request.Header.Values("Content-Type")) == 0
	if !(o.emptyBodyIsObject && noBody) {
		if err := checkContentType(c.Request.Header); err != nil {
			return nil, err
		}
	}
	body, err := httpbody.Read(c.Writer, c.Request, g.Config.MaxBodyBytes)
	switch {
	case errors.Is(err, httpbody.ErrTooLarge):
		return nil, ErrPayloadTooLarge // when declared so, before the body is read
	case err != nil:
		// The client stopped sending (disconnected, or cut by the server's
		// read timeout): an incomplete body is not JSON. The client's fault,
		// not a 500; nothing was claimed.
		return nil, problem.Wrap(errBodyUnreadable, fmt.Errorf("read body: %w", err))
	}
	key, err := KeyFromHeader(c.Request.Header)
	if err != nil {
		return nil, err
	}
	if o.emptyBodyIsObject && len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	canonical, err := Canonicalize(body)
	if err != nil {
		return nil, err
	}
	fpRoute := route
	if _, tmpl, _ := strings.Cut(route, " "); tmpl != c.Request.URL.Path {
		fpRoute = route + " " + c.Request.URL.Path
	}
	return &Request{
		Scope:       Scope{Tenant: g.Tenant(c), Route: route, Key: key},
		Fingerprint: fingerprint(c.Request.Method, fpRoute, canonical),
		Owner:       NewOwnerToken(),
		Body:        canonical,
	}, nil
}

func (g *Gateway) reject(c *gin.Context, route string, err error) {
	switch {
	case errors.Is(err, ErrKeyMissing):
		g.Metrics.outcome(route, OutcomeMissing)
	case errors.Is(err, ErrKeyInvalid):
		g.Metrics.outcome(route, OutcomeInvalid)
	case errors.Is(err, ErrKeyInUse):
		g.Metrics.outcome(route, OutcomeInUse)
	case errors.Is(err, ErrKeyReused):
		g.Metrics.outcome(route, OutcomeReused)
	default:
		g.Metrics.outcome(route, OutcomeFailed)
	}
	if !problem.Write(c.Writer, err) {
		g.Logger.ErrorContext(c.Request.Context(), "idempotency gateway", "err", err)
	}
	c.Abort()
}

// keepLease extends the Redis and Postgres leases every Lease/3 until the
// returned stop is called; stop waits for the keeper to end. A slow request
// therefore never loses its key to a duplicate while it still runs.
func (g *Gateway) keepLease(ctx context.Context, req *Request, redisHeld bool) (stop func()) {
	return keepAlive(ctx, g.Config.Lease/3, func(ctx context.Context) {
		if redisHeld {
			if ok, err := g.Leases.Extend(ctx, req.Scope, req.Fingerprint, req.Owner, g.Config.Lease); err != nil {
				g.Logger.WarnContext(ctx, "extend redis lease", "err", err)
			} else if ok {
				g.Metrics.extended("redis")
			}
		}
		g.Store.extend(ctx, g.DB, req.Scope, req.Owner, g.Logger)
	})
}

// keepAlive calls extend every interval until stop is called; stop waits
// for the call in flight to end.
func keepAlive(ctx context.Context, interval time.Duration, extend func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			extend(ctx)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// NewOwnerToken returns a random lease owner token (128 bits, hex).
func NewOwnerToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("idempotency: random: " + err.Error())
	}
	return hex.EncodeToString(b)
}
