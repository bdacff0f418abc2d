package main

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/testenv"
)

// startAPI runs the api with vars (plus a database and Redis prefix of the
// test's own) and returns its base URL; it is stopped, and must exit 0, at
// the end of the test.
func startAPI(t *testing.T, vars map[string]string) string {
	t.Helper()
	_, dbURL := pgtest.NewDB(t)
	_, prefix := testenv.Redis(t)
	all := map[string]string{
		"HTTP_ADDR":        "127.0.0.1:0",
		"DATABASE_URL":     dbURL,
		"REDIS_URL":        testenv.RedisURL(),
		"REDIS_KEY_PREFIX": prefix,
	}
	for k, v := range vars {
		all[k] = v
	}
	ctx, stop := context.WithCancel(context.Background())
	lines, done := runAPI(ctx, all)
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done, "exit 0")
	})
	return "http://" + waitForLog(t, lines, done, "listening")
}

// TestLimitsFromEnvironment: RATE_LIMIT and the HTTP_* limits reach the
// running server: the third request of a tenant limited to 1/m (bursts of
// 2) is 429 with Retry-After, the other tenant is not limited, a header
// over HTTP_MAX_HEADER_BYTES is 431 and a body over HTTP_MAX_BODY_BYTES 413.
func TestLimitsFromEnvironment(t *testing.T) {
	t.Parallel()
	base := startAPI(t, map[string]string{
		"RATE_LIMIT":            "1/m",
		"RATE_LIMIT_TENANTS":    "globex:0",
		"HTTP_MAX_HEADER_BYTES": "2048",
		"HTTP_MAX_BODY_BYTES":   "2048",
	})
	do := func(method, apiKey string, header http.Header, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, base+map[string]string{"GET": "/v1/products", "POST": "/v1/checkouts"}[method], strings.NewReader(body))
		require.NoError(t, err)
		req.Header = header.Clone()
		if req.Header == nil {
			req.Header = http.Header{}
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}

	require.Equal(t, http.StatusOK, do("GET", "sk_test_acme", nil, "").StatusCode)
	require.Equal(t, http.StatusOK, do("GET", "sk_test_acme", nil, "").StatusCode)
	limited := do("GET", "sk_test_acme", nil, "")
	require.Equal(t, http.StatusTooManyRequests, limited.StatusCode)
	require.Equal(t, "application/problem+json", limited.Header.Get("Content-Type"))
	require.NotEmpty(t, limited.Header.Get("Retry-After"))
	for range 3 {
		require.Equal(t, http.StatusOK, do("GET", "sk_test_globex", nil, "").StatusCode, "globex:0 is not limited")
	}

	big := http.Header{"X-Padding": {strings.Repeat("p", 2048+8192)}} // beyond net/http's slack, even on a reused connection
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, do("GET", "sk_test_globex", big, "").StatusCode)

	jsonHeader := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"big-body"}}
	require.Equal(t, http.StatusRequestEntityTooLarge,
		do("POST", "sk_test_globex", jsonHeader, `{"email":"`+strings.Repeat("a", 3000)+`"}`).StatusCode)
}

// TestMetricsAddr: unset, /metrics is on HTTP_ADDR; set, /metrics (with
// /healthz and /readyz, for probes that stay off the public port) is on
// its own port and the public one answers 404 for it.
func TestMetricsAddr(t *testing.T) {
	t.Parallel()
	t.Run("unset", func(t *testing.T) {
		t.Parallel()
		base := startAPI(t, nil)
		status, _ := testenv.Get(t, base+"/healthz") // one request to count
		require.Equal(t, http.StatusOK, status)
		status, body := testenv.Get(t, base+"/metrics")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, "checkout_http_request_duration_seconds")
	})
	t.Run("set", func(t *testing.T) {
		t.Parallel()
		metrics := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
		base := startAPI(t, map[string]string{"METRICS_ADDR": metrics})
		status, _ := testenv.Get(t, base+"/healthz") // one request to count
		require.Equal(t, http.StatusOK, status)
		status, _ = testenv.Get(t, base+"/metrics")
		require.Equal(t, http.StatusNotFound, status, "not on the public port")
		status, body := testenv.Get(t, "http://"+metrics+"/metrics")
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, "checkout_http_request_duration_seconds")
		for _, probe := range []string{"/healthz", "/readyz"} {
			status, body = testenv.Get(t, "http://"+metrics+probe)
			require.Equal(t, http.StatusOK, status, "%s: %s", probe, body)
		}
	})
}
