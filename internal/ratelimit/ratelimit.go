// Package ratelimit limits each tenant's request rate, in Redis, with the
// GCRA of github.com/go-redis/redis_rate/v10 (a token bucket without a
// background refill: one key per tenant and bucket, one round trip per
// request). It runs right after authentication and before any idempotency
// work (CONTRACT.md, "Principals"): a request over the limit is answered
// 429 rate_limited with Retry-After, and nothing about it is stored, so the
// same Idempotency-Key works once the limit allows.
package ratelimit

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-redis/redis_rate/v10"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/checkout/internal/problem"
)

// Limit is a rate (Rate events per Period) with bursts of up to Burst
// events. The zero Limit means no limit.
type Limit = redis_rate.Limit

// ParseLimit parses a RATE_LIMIT value: "0" (no limit) or "N/s", "N/m",
// "N/h" (N requests a second, minute or hour, N ≥ 1), with bursts of up to
// twice the rate (Burst = 2N). It returns an error naming the expected form
// for anything else.
func ParseLimit(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return Limit{}, nil
	}
	n, unit, ok := strings.Cut(s, "/")
	rate, err := strconv.Atoi(n)
	if !ok || err != nil || rate < 1 || rate > math.MaxInt32/2 {
		return Limit{}, fmt.Errorf("%q: want 0 or N/s, N/m, N/h with N a positive integer", s)
	}
	periods := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}
	period, ok := periods[unit]
	if !ok {
		return Limit{}, fmt.Errorf("%q: the unit must be s, m or h", s)
	}
	return Limit{Rate: rate, Period: period, Burst: 2 * rate}, nil
}

// ParseTenantLimits parses RATE_LIMIT_TENANTS: "tenant:limit,tenant:limit"
// (e.g. "acme:50/s,globex:0"), each limit as ParseLimit reads it. An empty
// string is no override. It returns an error naming the bad entry.
func ParseTenantLimits(s string) (map[string]Limit, error) {
	out := map[string]Limit{}
	for i, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		tenant, spec, ok := strings.Cut(pair, ":")
		if !ok || tenant == "" {
			return nil, fmt.Errorf("entry %d: want tenant:limit", i+1)
		}
		if _, dup := out[tenant]; dup {
			return nil, fmt.Errorf("entry %d: tenant %s listed twice", i+1, tenant)
		}
		l, err := ParseLimit(spec)
		if err != nil {
			return nil, fmt.Errorf("entry %d (tenant %s): %w", i+1, tenant, err)
		}
		out[tenant] = l
	}
	return out, nil
}

// Config is what the Limiter enforces.
type Config struct {
	// Default is every tenant's limit on requests that are not replays
	// (RATE_LIMIT, default 200/s with bursts of 400).
	Default Limit
	// Tenants overrides Default per tenant (RATE_LIMIT_TENANTS).
	Tenants map[string]Limit
	// Replay is every tenant's limit on replays (RATE_LIMIT_REPLAY, default
	// 1000/s with bursts of 2000), a bucket of their own: a replay is served
	// from the Redis cache and costs no Postgres work.
	Replay Limit
}

// Enabled reports whether any limit is set.
func (c Config) Enabled() bool {
	if !c.Default.IsZero() || !c.Replay.IsZero() {
		return true
	}
	for _, l := range c.Tenants {
		if !l.IsZero() {
			return true
		}
	}
	return false
}

// limitFor returns the limit of tenant's bucket.
func (c Config) limitFor(tenant string, replay bool) Limit {
	if replay {
		return c.Replay
	}
	if l, ok := c.Tenants[tenant]; ok {
		return l
	}
	return c.Default
}

// Limiter is the per-tenant rate limit as gin middleware.
type Limiter struct {
	cfg     Config
	rl      *redis_rate.Limiter
	prefix  string
	logger  *slog.Logger
	limited *prometheus.CounterVec
	errors  prometheus.Counter

	// Tenant returns the authenticated tenant of a request.
	Tenant func(*gin.Context) string
	// Replay reports, cheaply, whether the request will be answered from
	// the replay cache; nil means no request is a replay. See Middleware.
	Replay func(*gin.Context) bool
}

// New returns a Limiter keeping its counters in rdb under prefix
// (REDIS_KEY_PREFIX): prefix + "ratelimit:{" + tenant + "}:" + bucket, one
// key per tenant and bucket ("request" or "replay"), expiring once idle.
// reg may be nil.
func New(rdb redis.UniversalClient, prefix string, cfg Config, logger *slog.Logger, reg prometheus.Registerer) *Limiter {
	l := &Limiter{
		cfg:    cfg,
		rl:     redis_rate.NewLimiter(unprefixed{rdb}),
		prefix: prefix,
		logger: logger,
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_rate_limited_total",
			Help: "Requests answered 429 rate_limited, by tenant and bucket (request, replay).",
		}, []string{"tenant", "bucket"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_rate_limiter_errors_total",
			Help: "Requests let through unlimited because Redis did not answer the rate limiter (it fails open).",
		}),
	}
	if reg != nil {
		reg.MustRegister(l.limited, l.errors)
	}
	return l
}

// ErrRateLimited is the 429 answer; Middleware sends a copy with the
// request's own Retry-After.
var ErrRateLimited = problem.New(problem.CodeRateLimited,
	"This API key's rate limit is exceeded. Nothing was executed or stored: retry after Retry-After seconds, with the same Idempotency-Key.")

// Middleware counts the request against its tenant's bucket and answers
// 429 rate_limited, with Retry-After in whole seconds rounded up, when the
// bucket is empty. It must run after authentication and before the
// idempotency gateway, so that a limited request leaves no trace under its
// key.
//
// Replays: Replay classifies the request before any idempotency work with
// one read (EXISTS of the key's cached response in Redis, by the header
// alone; the body is not read). A request it calls a replay draws from the
// Replay bucket, any other from the tenant's own. A request that the probe
// wrongly calls a replay (its body differs from the stored one) gets 422
// from the same cache, which costs no more than a replay; a replay the probe
// misses (the cache was flushed, Postgres answers) is counted as a first
// execution, the stricter bucket. So the generous limit can only ever buy
// answers from the Redis cache, never a new key row or a lease.
//
// Redis failures: the limiter fails open (the request goes on unlimited,
// logged and counted in checkout_rate_limiter_errors_total), whatever
// DEDUP_FAILURE_MODE says. The limit is a fairness shield, not a guarantee:
// in closed mode the gateway answers the checkout 503 one step later
// anyway, and in open mode an operator has chosen availability on Postgres
// alone, which a limiter that cannot count must not take back, nor should
// it fail reads such as GET /v1/products that never need Redis.
func (l *Limiter) Middleware() gin.HandlerFunc {
	if !l.cfg.Enabled() {
		return func(c *gin.Context) { c.Next() }
	}
	return func(c *gin.Context) {
		tenant := l.Tenant(c)
		replay := l.Replay != nil && l.Replay(c)
		bucket := "request"
		if replay {
			bucket = "replay"
		}
		limit := l.cfg.limitFor(tenant, replay)
		if limit.IsZero() {
			c.Next()
			return
		}
		res, err := l.rl.Allow(c.Request.Context(), l.key(tenant, bucket), limit)
		if err != nil {
			l.errors.Inc()
			l.logger.WarnContext(c.Request.Context(), "rate limiter unavailable; letting the request through", "err", err)
			c.Next()
			return
		}
		if res.Allowed > 0 {
			c.Next()
			return
		}
		l.limited.WithLabelValues(tenant, bucket).Inc()
		problem.Write(c.Writer, ErrRateLimited.WithRetryAfter(retryAfterSeconds(res.RetryAfter)))
		c.Abort()
	}
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// key is the Redis key of tenant's bucket. The hash tag keeps a tenant's
// buckets in one Redis Cluster slot.
func (l *Limiter) key(tenant, bucket string) string {
	return l.prefix + "ratelimit:{" + tenant + "}:" + bucket
}

// redisRatePrefix is what redis_rate puts before every key it is given.
const redisRatePrefix = "rate:"

// unprefixed hands redis_rate's commands to Redis with the "rate:" it puts
// before every key removed, so that the key is exactly the one Limiter.key
// built and starts with REDIS_KEY_PREFIX like every key the service writes.
type unprefixed struct{ redis.UniversalClient }

func strip(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = strings.TrimPrefix(k, redisRatePrefix)
	}
	return out
}

func (u unprefixed) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return u.UniversalClient.Eval(ctx, script, strip(keys), args...)
}

func (u unprefixed) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return u.UniversalClient.EvalSha(ctx, sha1, strip(keys), args...)
}

func (u unprefixed) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return u.UniversalClient.EvalRO(ctx, script, strip(keys), args...)
}

func (u unprefixed) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return u.UniversalClient.EvalShaRO(ctx, sha1, strip(keys), args...)
}

func (u unprefixed) Del(ctx context.Context, keys ...string) *redis.IntCmd {
	return u.UniversalClient.Del(ctx, strip(keys)...)
}
