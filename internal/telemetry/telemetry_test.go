package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/telemetry"
)

func TestRequestIDAndContextAttrs(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	logger := telemetry.NewLogger(&logs, slog.LevelInfo)
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(telemetry.RequestID())
	r.GET("/", func(c *gin.Context) {
		ctx := telemetry.WithAttrs(c.Request.Context(), slog.String("tenant", "acme"))
		logger.InfoContext(ctx, "hello")
	})
	tests := []struct {
		name, in string
		kept     bool
	}{
		{"a well-formed id is kept", "abc-123_x.y", true},
		{"none gets one", "", false},
		{"too long is replaced", strings.Repeat("a", 65), false},
		{"odd characters are replaced", "a b\"c", false},
	}
	for _, tc := range tests {
		logs.Reset()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		if tc.in != "" {
			req.Header.Set(telemetry.RequestIDHeader, tc.in)
		}
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		id := w.Header().Get(telemetry.RequestIDHeader)
		require.NotEmpty(t, id, tc.name)
		if tc.kept {
			require.Equal(t, tc.in, id, tc.name)
		} else {
			require.NotEqual(t, tc.in, id, tc.name)
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal(logs.Bytes(), &rec), tc.name)
		require.Equal(t, id, rec["request_id"], tc.name)
		require.Equal(t, "acme", rec["tenant"], tc.name)
	}
}

func TestReady(t *testing.T) {
	t.Parallel()
	ok := telemetry.Check{Name: "postgres", Ping: func(context.Context) error { return nil }}
	down := telemetry.Check{Name: "redis", Ping: func(context.Context) error { return errors.New("connection refused") }}

	w := httptest.NewRecorder()
	telemetry.Ready(ok)(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	require.Equal(t, 200, w.Code)

	w = httptest.NewRecorder()
	telemetry.Ready(ok, down)(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	require.Equal(t, 503, w.Code)
	body := readyBody(t, w)
	require.Equal(t, "unavailable", body.Status)
	require.Equal(t, map[string]string{"redis": "connection refused"}, body.Failing)
}

// TestReadyChecksHaveTheirOwnTimeout: a dependency that stalls is reported
// failing, and only it: a healthy one checked after it is not cut off by the
// stalled one's time. The checks run at once: each stalled check sees the
// other one running (checks run one after another never would), so the
// answer comes after one ReadyTimeout, not one per stalled check.
func TestReadyChecksHaveTheirOwnTimeout(t *testing.T) {
	t.Parallel()
	var running, overlapped atomic.Int32
	stalled := func(name string) telemetry.Check {
		return telemetry.Check{Name: name, Ping: func(ctx context.Context) error {
			running.Add(1)
			defer running.Add(-1)
			for ctx.Err() == nil {
				if running.Load() == 2 {
					overlapped.Add(1)
					break
				}
				time.Sleep(time.Millisecond)
			}
			<-ctx.Done()
			return ctx.Err()
		}}
	}
	// Like a real client, the healthy check fails if its context is over.
	healthy := telemetry.Check{Name: "redis", Ping: func(ctx context.Context) error { return ctx.Err() }}

	w := httptest.NewRecorder()
	telemetry.Ready(stalled("postgres"), stalled("rabbitmq"), healthy)(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	require.Equal(t, 503, w.Code)
	body := readyBody(t, w)
	require.Equal(t, "unavailable", body.Status)
	require.Equal(t, map[string]string{
		"postgres": context.DeadlineExceeded.Error(),
		"rabbitmq": context.DeadlineExceeded.Error(),
	}, body.Failing, "only the stalled dependencies fail")
	require.Equal(t, int32(2), overlapped.Load(), "the two stalled checks ran at the same time")
}

// readyBody decodes a /readyz answer.
func readyBody(t *testing.T, w *httptest.ResponseRecorder) (body struct {
	Status  string            `json:"status"`
	Failing map[string]string `json:"failing"`
}) {
	t.Helper()
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
	return body
}

// TestHealthProbesAreNotLoggedAtInfo: docker compose probes /readyz every few
// seconds; at info each probe would be a line in the foreground output.
func TestHealthProbesAreNotLoggedAtInfo(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	var logs bytes.Buffer
	ready := true
	r := gin.New()
	r.Use(telemetry.HTTPMetrics(prometheus.NewRegistry(), telemetry.NewLogger(&logs, slog.LevelInfo)))
	r.GET("/healthz", gin.WrapF(telemetry.Healthy))
	r.GET("/readyz", gin.WrapF(telemetry.Ready(telemetry.Check{Name: "db", Ping: func(context.Context) error {
		if ready {
			return nil
		}
		return errors.New("down")
	}})))
	r.GET("/v1/products", func(c *gin.Context) { c.Status(http.StatusOK) })
	get := func(path string) string {
		logs.Reset()
		r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
		return logs.String()
	}

	require.Empty(t, get("/healthz"))
	require.Empty(t, get("/readyz"))
	require.Contains(t, get("/v1/products"), `"route":"/v1/products"`)
	ready = false
	require.Contains(t, get("/readyz"), `"status":503`, "a failing probe is logged")
}

// TestRedisLogger: go-redis's lines become Debug records of the JSON log
// with source go-redis, and nothing at Info.
func TestRedisLogger(t *testing.T) {
	t.Parallel()
	var debug, info bytes.Buffer
	telemetry.RedisLogger(telemetry.NewLogger(&debug, slog.LevelDebug)).Printf(context.Background(),
		"redis: connection pool: failed to dial after %d attempts: %v", 5, errors.New("connection refused"))
	telemetry.RedisLogger(telemetry.NewLogger(&info, slog.LevelInfo)).Printf(context.Background(), "dropped %d", 1)
	require.Zero(t, info.Len(), "nothing at Info")
	var rec map[string]any
	require.NoError(t, json.Unmarshal(debug.Bytes(), &rec))
	require.Equal(t, "DEBUG", rec["level"])
	require.Equal(t, "go-redis", rec["source"])
	require.Equal(t, "redis: connection pool: failed to dial after 5 attempts: connection refused", rec["msg"])
}
