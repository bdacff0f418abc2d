package tracing

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"gorm.io/gorm"
)

// Gin returns the server-span middleware of the HTTP API (otelgin): one
// span per request named by its route template, continuing the
// traceparent a client sends, with the probes and the metrics scrape
// left out. With tracing off it is a no-op handler.
func Gin(service string) gin.HandlerFunc {
	if !Enabled() {
		return func(c *gin.Context) { c.Next() }
	}
	return otelgin.Middleware(service, otelgin.WithGinFilter(func(c *gin.Context) bool {
		switch c.FullPath() {
		case "/healthz", "/readyz", "/metrics":
			return false
		}
		return true
	}))
}

// HTTPTransport wraps rt (the transport stripe-go's HTTP client uses) in
// otelhttp's: one client span per HTTP request, and the traceparent sent
// along. With tracing off it returns rt itself.
func HTTPTransport(rt http.RoundTripper) http.RoundTripper {
	if !Enabled() {
		return rt
	}
	return otelhttp.NewTransport(rt)
}

// InstrumentGORM adds statement spans to db (gormPlugin): a client span
// per statement, child of the operation running it. With tracing off it
// does nothing. It returns the callbacks' registration error.
func InstrumentGORM(db *gorm.DB) error {
	if !Enabled() {
		return nil
	}
	return db.Use(gormPlugin{})
}

// InstrumentRedis adds redisotel's tracing hook to rdb: a client span per
// command or pipeline (the lease's SET NX, its compare-and-set scripts).
// With tracing off it does nothing. It returns the hook's error.
func InstrumentRedis(rdb redis.UniversalClient) error {
	if !Enabled() {
		return nil
	}
	return redisotel.InstrumentTracing(rdb)
}
