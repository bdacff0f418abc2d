package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/ratelimit"
	"github.com/onceonly/checkout/internal/testenv"
)

// limit parses a RATE_LIMIT value.
func limit(t testing.TB, s string) ratelimit.Limit {
	t.Helper()
	l, err := ratelimit.ParseLimit(s)
	require.NoError(t, err)
	return l
}

func withLimits(c ratelimit.Config) func(*options) {
	return func(o *options) { o.rateLimits = c }
}

// requireRateLimited asserts r is the contract's 429: problem rate_limited
// with a Retry-After of 1..max seconds (its schema is checked against
// api/openapi.yaml by h.send).
func requireRateLimited(t testing.TB, r reply, max int) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, r.status, "%s", r.body)
	require.Equal(t, "rate_limited", decodeProblem(t, r).Code)
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", r.header.Get("Retry-After"))
	require.True(t, ra >= 1 && ra <= max, "Retry-After %d, want 1..%d", ra, max)
	require.Empty(t, r.header.Get(idempotency.ReplayedHeader))
}

func (h *harness) limited(tenant, bucket string) float64 {
	return testutil.ToFloat64(gathered{h.registry.Registry, "checkout_rate_limited_total", map[string]string{"tenant": tenant, "bucket": bucket}})
}

// TestRateLimitFloodOneTenant: one tenant floods the API with unique keys
// at 1/m (bursts of 2); exactly its burst executes, the rest get 429 and
// leave no key row; the other tenant, flooding at the same time, gets its
// own burst, unaffected.
func TestRateLimitFloodOneTenant(t *testing.T) {
	t.Parallel()
	h := setup(t, withLimits(ratelimit.Config{Default: limit(t, "1/m")}))

	const n = 20
	replies := map[string][]reply{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, apiKey := range []string{"sk_test_acme", "sk_test_globex"} {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := h.do(context.Background(), apiKey, fmt.Sprintf("flood-%d", i), teeBody)
				mu.Lock()
				replies[apiKey] = append(replies[apiKey], r)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()

	for _, apiKey := range []string{"sk_test_acme", "sk_test_globex"} {
		created := 0
		for _, r := range replies[apiKey] {
			if r.status == http.StatusCreated {
				created++
				continue
			}
			requireRateLimited(t, r, 60)
		}
		require.Equal(t, 2, created, "%s: the burst (twice the rate) executes, no more", apiKey)
	}
	require.Equal(t, 2, h.count(`SELECT count(*) FROM idempotency_keys WHERE tenant_id = 'acme'`), "the key table grows by the allowed rate only")
	require.Equal(t, 2, h.count(`SELECT count(*) FROM idempotency_keys WHERE tenant_id = 'globex'`))
	require.Equal(t, 4, h.count(`SELECT count(*) FROM orders`))
	require.Equal(t, float64(n-2), h.limited("acme", "request"))
	require.Equal(t, float64(n-2), h.limited("globex", "request"))

	// Every key the limiter writes is under REDIS_KEY_PREFIX.
	ctx := context.Background()
	require.EqualValues(t, 1, h.rdb.Exists(ctx, h.prefix+"ratelimit:{acme}:request").Val())
	require.EqualValues(t, 0, h.rdb.Exists(ctx, "rate:"+h.prefix+"ratelimit:{acme}:request").Val())
}

// TestRateLimitKeyTableGrowth: four clients flood one tenant limited to
// 5/s (bursts of 10) with unique keys for 1.5s; the key rows created never
// exceed the burst plus the rate times the time elapsed, and every request
// not limited executed.
func TestRateLimitKeyTableGrowth(t *testing.T) {
	t.Parallel()
	h := setup(t, withLimits(ratelimit.Config{Default: limit(t, "5/s")}))
	var (
		mu      sync.Mutex
		created int
		limited int
		wg      sync.WaitGroup
	)
	start := time.Now()
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(start) < 1500*time.Millisecond && i < 500; i++ {
				r := h.do(context.Background(), "sk_test_acme", fmt.Sprintf("grow-%d-%d", c, i), teeBody)
				mu.Lock()
				if r.status == http.StatusCreated {
					created++
				} else {
					requireRateLimited(t, r, 1)
					limited++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	rows := h.count(`SELECT count(*) FROM idempotency_keys`)
	require.Equal(t, created, rows, "a row per executed request, none per 429")
	require.GreaterOrEqual(t, created, 10, "the burst is allowed")
	bound := 10 + int(elapsed.Seconds()*5) + 1
	require.LessOrEqual(t, rows, bound, "rows after %s: at most the burst + 5/s", elapsed)
	require.Positive(t, limited, "the flood was limited")
}

// TestRateLimitNotStored: a 429 leaves nothing under its key, in Postgres
// or Redis; once the limit allows, the same key executes as a first request.
func TestRateLimitNotStored(t *testing.T) {
	t.Parallel()
	h := setup(t, withLimits(ratelimit.Config{Default: limit(t, "1/m")}))
	require.Equal(t, http.StatusCreated, h.checkout("nl-a", teeBody).status)
	require.Equal(t, http.StatusCreated, h.checkout("nl-b", teeBody).status)

	requireRateLimited(t, h.checkout("nl-1", teeBody), 60)
	require.Equal(t, 0, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'nl-1'`))
	scope := idempotency.Scope{Tenant: "acme", Route: "POST /v1/checkouts", Key: "nl-1"}
	n, err := h.rdb.Exists(context.Background(), h.prefix+"idem:{"+scope.Hash()+"}:lease", h.prefix+"idem:{"+scope.Hash()+"}:resp").Result()
	require.NoError(t, err)
	require.Zero(t, n, "no lease and no cached response for a limited key")

	// The minute passes: the bucket is full again.
	require.NoError(t, h.rdb.Del(context.Background(), h.prefix+"ratelimit:{acme}:request").Err())
	r := h.checkout("nl-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Empty(t, r.header.Get(idempotency.ReplayedHeader), "a first execution, not a replay of the 429")
}

// TestRateLimitReplays: replays, recognised by the key's cached response,
// draw from a bucket of their own: exhausting the replay bucket leaves new
// checkouts their limit, and the other way round.
func TestRateLimitReplays(t *testing.T) {
	t.Parallel()
	h := setup(t, withLimits(ratelimit.Config{Default: limit(t, "1/m"), Replay: limit(t, "1/m")}))
	first := h.checkout("rp-1", teeBody)
	require.Equal(t, http.StatusCreated, first.status)
	for range 2 {
		r := h.checkout("rp-1", teeBody)
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
		require.Equal(t, "true", r.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, string(first.body), string(r.body))
	}
	requireRateLimited(t, h.checkout("rp-1", teeBody), 60)
	require.Equal(t, float64(1), h.limited("acme", "replay"))

	require.Equal(t, http.StatusCreated, h.checkout("rp-2", teeBody).status, "replays did not use up the request bucket")
	requireRateLimited(t, h.checkout("rp-3", teeBody), 60)
	require.Equal(t, float64(1), h.limited("acme", "request"))
	require.Equal(t, 2, h.count(`SELECT count(*) FROM idempotency_keys`))
}

// TestRateLimitTenantOverride: RATE_LIMIT_TENANTS limits one tenant while
// the default (0) leaves the others unlimited.
func TestRateLimitTenantOverride(t *testing.T) {
	t.Parallel()
	tenants, err := ratelimit.ParseTenantLimits("acme:1/m")
	require.NoError(t, err)
	h := setup(t, withLimits(ratelimit.Config{Tenants: tenants}))
	for i := range 2 {
		require.Equal(t, http.StatusCreated, h.checkout(fmt.Sprintf("ov-%d", i), teeBody).status)
	}
	requireRateLimited(t, h.checkout("ov-2", teeBody), 60)
	requireRateLimited(t, h.get("sk_test_acme", "/v1/products"), 60)
	for i := range 5 {
		r := h.do(context.Background(), "sk_test_globex", fmt.Sprintf("ov-%d", i), teeBody)
		require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	}
}

// TestRateLimitRedisDown: the limiter fails open. With Redis gone, reads
// and (in open mode) checkouts go on unlimited; in closed mode the checkout
// gets the gateway's 503, not a 429 or a 500.
func TestRateLimitRedisDown(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.FailureMode{idempotency.FailOpen, idempotency.FailClosed} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			rs := testenv.StartRedis(t)
			h := setup(t, withLimits(ratelimit.Config{Default: limit(t, "1/m")}), func(o *options) {
				o.redisURL = rs.URL()
				o.failureMode = mode
			})
			rs.Stop()
			for i := range 4 {
				r := h.checkout(fmt.Sprintf("down-%d", i), teeBody)
				if mode == idempotency.FailOpen {
					require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
				} else {
					require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
					require.Equal(t, "unavailable", decodeProblem(t, r).Code)
				}
			}
			require.Equal(t, http.StatusOK, h.get("sk_test_acme", "/v1/products").status)
			require.Equal(t, float64(5), testutil.ToFloat64(gathered{h.registry.Registry, "checkout_rate_limiter_errors_total", nil}))
			require.Zero(t, h.limited("acme", "request"))
		})
	}
}
