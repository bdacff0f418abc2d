// Package telemetry is the processes' shared observability plumbing: JSON
// logs (log/slog) that carry request-scoped attributes from the context,
// request ids, HTTP metrics and the /metrics, /healthz and /readyz handlers.
package telemetry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceonly/checkout/internal/tracing"
)

// NewLogger returns a JSON logger at level whose records also carry the
// attributes added to their context with WithAttrs, and trace_id and
// span_id inside a trace (tracing.LogHandler).
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(tracing.LogHandler(contextHandler{slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})}))
}

type attrsKey struct{}

// WithAttrs returns ctx carrying attrs, which every record logged with this
// context (logger.InfoContext and friends) then includes.
func WithAttrs(ctx context.Context, attrs ...slog.Attr) context.Context {
	prev, _ := ctx.Value(attrsKey{}).([]slog.Attr)
	all := make([]slog.Attr, 0, len(prev)+len(attrs))
	all = append(append(all, prev...), attrs...)
	return context.WithValue(ctx, attrsKey{}, all)
}

type contextHandler struct{ slog.Handler }

func (h contextHandler) Handle(ctx context.Context, r slog.Record) error {
	if attrs, ok := ctx.Value(attrsKey{}).([]slog.Attr); ok {
		r.AddAttrs(attrs...)
	}
	return h.Handler.Handle(ctx, r)
}

func (h contextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return contextHandler{h.Handler.WithAttrs(attrs)}
}

func (h contextHandler) WithGroup(name string) slog.Handler {
	return contextHandler{h.Handler.WithGroup(name)}
}

// RequestIDHeader carries the request id in and out.
const RequestIDHeader = "X-Request-Id"

// RequestID takes a well-formed X-Request-Id from the client (up to 64
// characters of [A-Za-z0-9._-]) or makes one, echoes it in the response, and
// puts it into the context's log attributes as request_id.
func RequestID() gin.HandlerFunc {
	return func(c *gin.Context) {
		id := c.GetHeader(RequestIDHeader)
		if !validRequestID(id) {
			b := make([]byte, 12)
			rand.Read(b)
			id = hex.EncodeToString(b)
		}
		c.Header(RequestIDHeader, id)
		c.Request = c.Request.WithContext(WithAttrs(c.Request.Context(), slog.String("request_id", id)))
		c.Next()
	}
}

func validRequestID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// HTTPMetrics records checkout_http_request_duration_seconds{method,route,status}
// (route is the template, e.g. /v1/orders/:id) and logs each request once: a
// passing health probe (/healthz, /readyz: the container's healthcheck, every
// few seconds) at debug level, every other request at info. An observation
// made inside a sampled trace carries its trace_id as an exemplar.
func HTTPMetrics(reg prometheus.Registerer, logger *slog.Logger) gin.HandlerFunc {
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "checkout_http_request_duration_seconds",
		Help:    "HTTP request latency by method, route template and status.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"method", "route", "status"})
	reg.MustRegister(hist)
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		route := c.FullPath()
		if route == "" {
			route = "unmatched"
		}
		status := strconv.Itoa(c.Writer.Status())
		elapsed := time.Since(start)
		tracing.Observe(c.Request.Context(), hist.WithLabelValues(c.Request.Method, route, status), elapsed.Seconds())
		level := slog.LevelInfo
		if (route == "/healthz" || route == "/readyz") && c.Writer.Status() < http.StatusBadRequest {
			level = slog.LevelDebug
		}
		logger.Log(c.Request.Context(), level, "http request", "method", c.Request.Method,
			"route", route, "status", c.Writer.Status(), "duration_ms", elapsed.Milliseconds())
	}
}

// Check is one readiness probe: Name is the dependency, Ping its test.
type Check struct {
	Name string
	Ping func(context.Context) error
}

// ReadyTimeout is how long each readiness check may take.
const ReadyTimeout = 2 * time.Second

// Ready returns the /readyz handler: 200 {"status":"ready"} when every check
// passes within ReadyTimeout, else 503
// {"status":"unavailable","failing":{name: error}}. The checks run at once,
// each under its own timeout, so that a stalled dependency neither delays
// the others nor makes them fail: each error is its own dependency's.
func Ready(checks ...Check) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		errs := make([]error, len(checks))
		var wg sync.WaitGroup
		for i, ch := range checks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
				defer cancel()
				errs[i] = ch.Ping(ctx)
			}()
		}
		wg.Wait()
		failing := map[string]string{}
		for i, ch := range checks {
			if errs[i] != nil {
				failing[ch.Name] = errs[i].Error()
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if len(failing) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]any{"status": "unavailable", "failing": failing})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"status": "ready"})
	}
}

// Healthy is the /healthz handler: 200 while the process runs.
func Healthy(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"status":"ok"}` + "\n"))
}

// MetricsHandler serves reg's series and the Go runtime's in the Prometheus
// text format, or in OpenMetrics to a scraper that asks for it, which is
// the format that carries the latency histograms' trace exemplars.
func MetricsHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true})
}

// NewRegistry returns a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// RedisLogger adapts l to go-redis's logger (redis.SetLogger), whose
// lines would otherwise go to stderr as plain text, outside the JSON log
// stream. They go to Debug with "source":"go-redis": a failed dial or
// command reaches the caller as an error too, and the callers log those
// (idempotency's "redis unavailable" warnings) and count them, so at Info
// a Redis outage is reported once per request, not twice, and not once per
// pool retry as well.
func RedisLogger(l *slog.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	return redisLogger{l}
}

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	if !r.l.Enabled(ctx, slog.LevelDebug) {
		return
	}
	r.l.DebugContext(ctx, fmt.Sprintf(format, v...), "source", "go-redis")
}

// Register registers c on reg and returns it, or returns the collector of
// the same description registered there already (a second Service, Store
// or Client on one registry in one process shares the first one's
// metrics). With reg nil it returns c, unregistered. It panics on any
// other registration error (a name with other labels or help), a bug of
// the program, as the client library's own must-register does.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(fmt.Sprintf("telemetry: register metrics: %v", err))
		}
		return are.ExistingCollector.(C)
	}
	return c
}
