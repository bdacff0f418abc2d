// Package api assembles the HTTP API: gin, authentication, the idempotency
// gateway, the checkout handlers and the operational endpoints. cmd/api runs
// it; tests run the same assembly against the real Postgres and Redis.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/auth"
	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/ratelimit"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/telemetry"
	"github.com/onceonly/checkout/internal/tracing"
	"github.com/onceonly/checkout/internal/webhooks"
)

// Deps are the API's dependencies. Registry may be nil (no metrics).
type Deps struct {
	DB       *gorm.DB
	Redis    redis.UniversalClient
	Payments checkout.PaymentProvider
	// Refunds is Stripe's Refund API; nil: Payments, if it has one.
	Refunds  refunds.Stripe
	Keys     *auth.Keys
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Config is the API's behaviour; see CONTRACT.md's configuration table.
type Config struct {
	RedisKeyPrefix string                  // REDIS_KEY_PREFIX
	TTL            time.Duration           // IDEMPOTENCY_TTL
	Lease          time.Duration           // IDEMPOTENCY_LEASE
	FailureMode    idempotency.FailureMode // DEDUP_FAILURE_MODE
	// WorkTimeout bounds one checkout's work (default 60s).
	WorkTimeout time.Duration
	// WebhookSecret is STRIPE_WEBHOOK_SECRET, the signing secret of POST
	// /v1/webhooks/stripe (empty: webhooks.DefaultSecret).
	WebhookSecret string
	// Saga tunes the payment saga (STRIPE_SEARCH_SETTLE,
	// PAYMENT_UNKNOWN_AFTER, PAYMENT_ACTION_TIMEOUT).
	Saga checkout.SagaConfig
	// RefundRetryAfter is how long an indeterminate refund attempt is
	// reconciled before the refund is parked requires_attention, never
	// resent under a new key (REFUND_RETRY_AFTER, default 24h).
	RefundRetryAfter time.Duration
	// RateLimits are the per-tenant limits (RATE_LIMIT, RATE_LIMIT_TENANTS,
	// RATE_LIMIT_REPLAY); the zero value limits nothing.
	RateLimits ratelimit.Config
	// MaxBodyBytes is the largest request body (HTTP_MAX_BODY_BYTES, 64 KiB
	// when 0); a larger one is 413 payload_too_large.
	MaxBodyBytes int64
	// MetricsElsewhere keeps /metrics off Handler: METRICS_ADDR is set and
	// cmd/api serves the registry on that port, out of the public one's
	// reach (a scrape needs no route through the load balancer, and the
	// internet sees no process internals).
	MetricsElsewhere bool
}

// API is the assembled service.
type API struct {
	Handler  http.Handler
	Service  *checkout.Service
	Refunds  *refunds.Service
	KeyStore *idempotency.Store
	// KeyRoutes are the routes behind the idempotency gateway, those that
	// take an Idempotency-Key: each needs a resume path in Completer.
	KeyRoutes []string
	// Checks are what /readyz tests: Postgres, and Redis when FailureMode
	// is closed (CONTRACT.md, "Deployment"). An open API takes checkouts
	// on Postgres alone while Redis is down, so failing its readiness then
	// would take every replica out of the load balancer for nothing.
	Checks []telemetry.Check
}

// New wires the API.
func New(cfg Config, d Deps) *API {
	if d.Now == nil {
		d.Now = time.Now
	}
	if cfg.WorkTimeout <= 0 {
		cfg.WorkTimeout = 60 * time.Second
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 10
	}
	reg := d.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	metrics := idempotency.NewMetrics(reg)
	store := &idempotency.Store{Lease: cfg.Lease, TTL: cfg.TTL, Now: d.Now, Metrics: metrics}
	svc := &checkout.Service{DB: d.DB, Keys: store, Payments: d.Payments, Logger: d.Logger, Now: d.Now,
		Saga: cfg.Saga, Metrics: checkout.NewMetrics(reg)}
	gateway := &idempotency.Gateway{
		Config: idempotency.Config{
			Lease:        cfg.Lease,
			TTL:          cfg.TTL,
			FailureMode:  cfg.FailureMode,
			WorkTimeout:  cfg.WorkTimeout,
			MaxBodyBytes: cfg.MaxBodyBytes,
		},
		Leases:  idempotency.NewLeases(d.Redis, cfg.RedisKeyPrefix),
		Store:   store,
		DB:      d.DB,
		Logger:  d.Logger,
		Metrics: metrics,
		Tenant:  auth.TenantOf,
	}
	handler := &checkoutHandler{Service: svc, DB: d.DB, Logger: d.Logger, Tenant: auth.TenantOf}
	stripeRefunds := d.Refunds
	if stripeRefunds == nil {
		stripeRefunds, _ = d.Payments.(refunds.Stripe)
	}
	svc.StrayRefunds = StrayRefunds(stripeRefunds)
	refundSvc := &refunds.Service{DB: d.DB, Keys: store, Stripe: stripeRefunds, Logger: d.Logger, Now: d.Now,
		RetryAfter: cfg.RefundRetryAfter, Metrics: refunds.NewMetrics(reg)}

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.ContextWithFallback = true
	r.HandleMethodNotAllowed = true
	// /v1/checkouts/ is not /v1/checkouts: a 404 problem, not a bare redirect
	// a client would follow with its body and key dropped.
	r.RedirectTrailingSlash = false
	// The request's server span first, so that everything after it, the
	// metrics' exemplars and the log lines included, is inside it.
	r.Use(tracing.Gin("checkout-api"), telemetry.RequestID(), telemetry.HTTPMetrics(reg, d.Logger), recovery(d.Logger))
	r.NoRoute(func(c *gin.Context) {
		problem.Write(c.Writer, problem.New(problem.CodeNotFound, "No such route."))
	})
	r.NoMethod(func(c *gin.Context) {
		problem.Write(c.Writer, problem.New(problem.CodeMethodNotAllowed,
			"This route does not accept "+c.Request.Method+"; the Allow header lists the methods it does."))
	})

	checks := []telemetry.Check{{Name: "postgres", Ping: func(ctx context.Context) error {
		sqlDB, err := d.DB.DB()
		if err != nil {
			return err
		}
		return sqlDB.PingContext(ctx)
	}}}
	if cfg.FailureMode != idempotency.FailOpen {
		checks = append(checks, telemetry.Check{Name: "redis", Ping: func(ctx context.Context) error { return d.Redis.Ping(ctx).Err() }})
	}
	r.GET("/healthz", gin.WrapF(telemetry.Healthy))
	r.GET("/readyz", gin.WrapF(telemetry.Ready(checks...)))
	if d.Registry != nil && !cfg.MetricsElsewhere {
		r.GET("/metrics", gin.WrapH(telemetry.MetricsHandler(d.Registry)))
	}

	// Stripe's webhooks: authenticated by their signature, not by a bearer
	// key, and outside the idempotency gateway (the inbox deduplicates them).
	secret := cfg.WebhookSecret
	if secret == "" {
		secret = webhooks.DefaultSecret
	}
	hook := &webhooks.Handler{
		DB:       d.DB,
		Verifier: webhooks.Verifier{Secret: secret},
		Orders:   webhookOrders{svc},
		Stripe:   webhookStripe{d.Payments},
		Logger:   d.Logger,
		Metrics:  webhooks.NewMetrics(reg),
	}
	if stripeRefunds != nil {
		hook.Refunds = webhookRefunds{refundSvc}
	}
	r.POST(webhooks.Path, gin.WrapH(hook))

	// The rate limit runs right after authentication, before any
	// idempotency work; replays of a checkout (found in the Redis cache by
	// the key alone) draw from a bucket of their own.
	limiter := ratelimit.New(d.Redis, cfg.RedisKeyPrefix, cfg.RateLimits, d.Logger, reg)
	limiter.Tenant = auth.TenantOf
	limiter.Replay = func(c *gin.Context) bool {
		return c.Request.Method+" "+c.FullPath() == checkout.Route && gateway.Cached(c, checkout.Route)
	}
	v1 := r.Group("/", auth.Middleware(d.Keys), limiter.Middleware())
	handler.Register(v1, gateway)
	if stripeRefunds != nil {
		(&refundHandler{Service: refundSvc, Logger: d.Logger}).Register(v1, gateway)
	}
	return &API{Handler: r, Service: svc, Refunds: refundSvc, KeyStore: store, KeyRoutes: gateway.Routes(), Checks: checks}
}

// recovery turns a panic into a logged generic 500 problem.
func recovery(logger *slog.Logger) gin.HandlerFunc {
	return gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, err any) {
		logger.ErrorContext(c.Request.Context(), "panic", "panic", err)
		problem.Write(c.Writer, problem.Internal)
		c.Abort()
	})
}
