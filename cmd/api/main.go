// Command api serves the checkout HTTP API (see CONTRACT.md): it applies the
// migrations (unless MIGRATE_ON_START=false: then cmd/migrate does), serves
// until SIGTERM or SIGINT, drains in-flight requests for up to
// SHUTDOWN_TIMEOUT, and exits 0.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/checkout/internal/api"
	"github.com/onceonly/checkout/internal/auth"
	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/ratelimit"
	"github.com/onceonly/checkout/internal/telemetry"
	"github.com/onceonly/checkout/internal/tracing"
	"github.com/onceonly/checkout/internal/webhooks"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}

// APP_ENV's values; unset or empty is development.
const (
	appEnvDevelopment = "development"
	appEnvProduction  = "production"
)

// settings are the API's environment variables (CONTRACT.md).
type settings struct {
	AppEnv   string `env:"APP_ENV" envDefault:"development"`
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8080"`
	// MetricsAddr, when set, serves /metrics (with /healthz and /readyz)
	// on its own port and takes /metrics off HTTP_ADDR's.
	MetricsAddr      string `env:"METRICS_ADDR"`
	DatabaseURL      string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable"`
	DatabaseMaxConns int    `env:"DATABASE_MAX_CONNS" envDefault:"20"`
	// MigrateOnStart applies the migrations before serving (make run,
	// compose). false leaves them to cmd/migrate, e.g. a Kubernetes Job, and
	// is required behind PgBouncer in transaction pooling, which breaks the
	// migrations' session advisory lock.
	MigrateOnStart bool   `env:"MIGRATE_ON_START" envDefault:"true"`
	RedisURL       string `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0"`
	RedisCluster   bool   `env:"REDIS_CLUSTER" envDefault:"false"`
	// RedisSentinelMaster and RedisSentinelAddrs, set together, reach Redis
	// through Sentinel (redisClient).
	RedisSentinelMaster string        `env:"REDIS_SENTINEL_MASTER"`
	RedisSentinelAddrs  string        `env:"REDIS_SENTINEL_ADDRS"`
	RedisKeyPrefix      string        `env:"REDIS_KEY_PREFIX" envDefault:"checkout:"`
	StripeAPIBase       string        `env:"STRIPE_API_BASE" envDefault:"http://127.0.0.1:12111"`
	StripeSecretKey     string        `env:"STRIPE_SECRET_KEY" envDefault:"sk_test_123" secret:"true"`
	StripeTimeout       time.Duration `env:"STRIPE_TIMEOUT" envDefault:"10s"`
	StripeMaxElapsed    time.Duration `env:"STRIPE_MAX_ELAPSED" envDefault:"20s"`
	StripeWebhookSecret string        `env:"STRIPE_WEBHOOK_SECRET" envDefault:"whsec_test_checkout" secret:"true"`
	StripeSettle        time.Duration `env:"STRIPE_SEARCH_SETTLE" envDefault:"60s"`
	UnknownAfter        time.Duration `env:"PAYMENT_UNKNOWN_AFTER" envDefault:"1h"`
	ActionTimeout       time.Duration `env:"PAYMENT_ACTION_TIMEOUT" envDefault:"30m"`
	IdempotencyTTL      time.Duration `env:"IDEMPOTENCY_TTL" envDefault:"24h"`
	IdempotencyLease    time.Duration `env:"IDEMPOTENCY_LEASE" envDefault:"30s"`
	DedupFailureMode    string        `env:"DEDUP_FAILURE_MODE" envDefault:"closed"`
	APIKeys             string        `env:"CHECKOUT_API_KEYS" envDefault:"acme:sk_test_acme,globex:sk_test_globex" secret:"true"`
	WorkTimeout         time.Duration `env:"WORK_TIMEOUT" envDefault:"60s"`
	RefundRetryAfter    time.Duration `env:"REFUND_RETRY_AFTER" envDefault:"24h"`
	ShutdownTimeout     time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"20s"`
	LogLevel            slog.Level    `env:"LOG_LEVEL" envDefault:"info"`
	// Rate limits per tenant (CONTRACT.md, "Principals"; internal/ratelimit).
	RateLimit        string `env:"RATE_LIMIT" envDefault:"200/s"`
	RateLimitTenants string `env:"RATE_LIMIT_TENANTS"`
	RateLimitReplay  string `env:"RATE_LIMIT_REPLAY" envDefault:"1000/s"`
	// The HTTP server's limits (api.ServerLimits).
	HTTPMaxHeaderBytes    int           `env:"HTTP_MAX_HEADER_BYTES" envDefault:"16384"`
	HTTPMaxBodyBytes      int64         `env:"HTTP_MAX_BODY_BYTES" envDefault:"65536"`
	HTTPReadHeaderTimeout time.Duration `env:"HTTP_READ_HEADER_TIMEOUT" envDefault:"5s"`
	HTTPReadTimeout       time.Duration `env:"HTTP_READ_TIMEOUT" envDefault:"15s"`
	HTTPWriteTimeout      time.Duration `env:"HTTP_WRITE_TIMEOUT" envDefault:"75s"`
	HTTPIdleTimeout       time.Duration `env:"HTTP_IDLE_TIMEOUT" envDefault:"60s"`
}

// limits parses the rate limits; each error names its variable.
func (s *settings) limits() (ratelimit.Config, []error) {
	var (
		c    ratelimit.Config
		errs []error
		err  error
	)
	if c.Default, err = ratelimit.ParseLimit(s.RateLimit); err != nil {
		errs = append(errs, fmt.Errorf("RATE_LIMIT: %w", err))
	}
	if c.Tenants, err = ratelimit.ParseTenantLimits(s.RateLimitTenants); err != nil {
		errs = append(errs, fmt.Errorf("RATE_LIMIT_TENANTS: %w", err))
	}
	if c.Replay, err = ratelimit.ParseLimit(s.RateLimitReplay); err != nil {
		errs = append(errs, fmt.Errorf("RATE_LIMIT_REPLAY: %w", err))
	}
	return c, errs
}

// serverLimits returns the HTTP server's limits; each error names its
// variable.
func (s *settings) serverLimits() (api.ServerLimits, []error) {
	l := api.ServerLimits{
		MaxHeaderBytes:    s.HTTPMaxHeaderBytes,
		ReadHeaderTimeout: s.HTTPReadHeaderTimeout,
		ReadTimeout:       s.HTTPReadTimeout,
		WriteTimeout:      s.HTTPWriteTimeout,
		IdleTimeout:       s.HTTPIdleTimeout,
	}
	var errs []error
	if s.HTTPMaxHeaderBytes < 1024 {
		errs = append(errs, fmt.Errorf("HTTP_MAX_HEADER_BYTES: %d is below the minimum of 1024", s.HTTPMaxHeaderBytes))
	}
	if s.HTTPMaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("HTTP_MAX_BODY_BYTES: %d is below the minimum of 1024", s.HTTPMaxBodyBytes))
	}
	for name, d := range map[string]time.Duration{"HTTP_READ_HEADER_TIMEOUT": s.HTTPReadHeaderTimeout,
		"HTTP_READ_TIMEOUT": s.HTTPReadTimeout, "HTTP_IDLE_TIMEOUT": s.HTTPIdleTimeout} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %s", name, d))
		}
	}
	if s.HTTPReadHeaderTimeout > s.HTTPReadTimeout {
		errs = append(errs, fmt.Errorf("HTTP_READ_HEADER_TIMEOUT: %s exceeds HTTP_READ_TIMEOUT (%s)", s.HTTPReadHeaderTimeout, s.HTTPReadTimeout))
	}
	if s.HTTPWriteTimeout <= s.WorkTimeout {
		errs = append(errs, fmt.Errorf("HTTP_WRITE_TIMEOUT: %s must exceed WORK_TIMEOUT (%s), or a slow checkout loses its answer", s.HTTPWriteTimeout, s.WorkTimeout))
	}
	return l, errs
}

// check validates what parsing cannot; each message names its variable.
func (s *settings) check() (*auth.Keys, idempotency.FailureMode, error) {
	var errs []error
	mode, err := idempotency.ParseFailureMode(s.DedupFailureMode)
	if err != nil {
		errs = append(errs, fmt.Errorf("DEDUP_FAILURE_MODE: %w", err))
	}
	keys, err := auth.ParseKeys(s.APIKeys)
	if err != nil {
		errs = append(errs, fmt.Errorf("CHECKOUT_API_KEYS: %w", err))
	}
	switch s.AppEnv {
	case appEnvDevelopment, appEnvProduction:
	default:
		// Closed set: a near miss (prod, Production) must not run with
		// the development keys and secret.
		errs = append(errs, fmt.Errorf("APP_ENV: %q is not one of %s, %s", s.AppEnv, appEnvDevelopment, appEnvProduction))
	}
	if s.AppEnv == appEnvProduction && keys != nil && keys.UsesDevelopmentKey() {
		errs = append(errs, errors.New("CHECKOUT_API_KEYS: the development keys (sk_test_acme, sk_test_globex) are not allowed with APP_ENV=production"))
	}
	if s.IdempotencyLease < 300*time.Millisecond {
		errs = append(errs, fmt.Errorf("IDEMPOTENCY_LEASE: %s is below the minimum of 300ms", s.IdempotencyLease))
	}
	if s.IdempotencyTTL <= s.IdempotencyLease {
		errs = append(errs, fmt.Errorf("IDEMPOTENCY_TTL: %s must exceed IDEMPOTENCY_LEASE (%s)", s.IdempotencyTTL, s.IdempotencyLease))
	}
	if err := config.CheckDatabaseURL(s.DatabaseURL); err != nil {
		errs = append(errs, err)
	}
	if err := payments.CheckAPIBase(s.StripeAPIBase); err != nil {
		errs = append(errs, fmt.Errorf("STRIPE_API_BASE: %w", err))
	}
	if s.StripeSettle < 0 {
		errs = append(errs, fmt.Errorf("STRIPE_SEARCH_SETTLE: must not be negative, got %s", s.StripeSettle))
	}
	for name, d := range map[string]time.Duration{"STRIPE_TIMEOUT": s.StripeTimeout, "STRIPE_MAX_ELAPSED": s.StripeMaxElapsed,
		"WORK_TIMEOUT": s.WorkTimeout, "SHUTDOWN_TIMEOUT": s.ShutdownTimeout,
		"PAYMENT_UNKNOWN_AFTER": s.UnknownAfter, "PAYMENT_ACTION_TIMEOUT": s.ActionTimeout, "REFUND_RETRY_AFTER": s.RefundRetryAfter} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %s", name, d))
		}
	}
	if s.StripeTimeout > s.StripeMaxElapsed {
		errs = append(errs, fmt.Errorf("STRIPE_TIMEOUT: %s exceeds STRIPE_MAX_ELAPSED (%s), so no retry could ever start", s.StripeTimeout, s.StripeMaxElapsed))
	}
	if s.WorkTimeout <= s.StripeMaxElapsed+s.StripeTimeout {
		errs = append(errs, fmt.Errorf("WORK_TIMEOUT: %s must exceed STRIPE_MAX_ELAPSED + STRIPE_TIMEOUT (%s), or a checkout is cut off while Stripe is still retried", s.WorkTimeout, s.StripeMaxElapsed+s.StripeTimeout))
	}
	if !strings.HasPrefix(s.StripeWebhookSecret, "whsec_") || len(s.StripeWebhookSecret) <= len("whsec_") {
		errs = append(errs, errors.New("STRIPE_WEBHOOK_SECRET: must be an endpoint signing secret, whsec_… (Stripe dashboard, Developers > Webhooks, or the one `stripe listen` prints)"))
	}
	if s.AppEnv == appEnvProduction && s.StripeWebhookSecret == webhooks.DefaultSecret {
		errs = append(errs, errors.New("STRIPE_WEBHOOK_SECRET: the development secret is not allowed with APP_ENV=production"))
	}
	if s.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(s.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("METRICS_ADDR: %w", err))
		}
	}
	if s.DatabaseMaxConns < 1 {
		errs = append(errs, fmt.Errorf("DATABASE_MAX_CONNS: must be at least 1"))
	}
	if s.RedisKeyPrefix == "" {
		errs = append(errs, errors.New("REDIS_KEY_PREFIX: must not be empty"))
	}
	return keys, mode, errors.Join(errs...)
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	var s settings
	if err := config.Load(getenv, &s); err != nil {
		return err
	}
	keys, mode, err := s.check()
	rateLimits, limitErrs := s.limits()
	serverLimits, serverErrs := s.serverLimits()
	if err := errors.Join(append(append([]error{err}, limitErrs...), serverErrs...)...); err != nil {
		return err
	}
	newRedis, err := redisClient(redisSettings{URL: s.RedisURL, Cluster: s.RedisCluster,
		SentinelMaster: s.RedisSentinelMaster, SentinelAddrs: s.RedisSentinelAddrs})
	if err != nil {
		return err
	}
	// Every request is logged: batching the records into one write every
	// 20ms instead of one a request takes a system call off each request
	// (a SIGKILL loses at most the last 20ms of them).
	logOut := telemetry.NewBufferedWriter(stdout, 20*time.Millisecond)
	defer logOut.Close()
	logger := telemetry.NewLogger(logOut, s.LogLevel)
	logger.Info("starting api", append(config.Masked(&s), "api_keys", keys.Fingerprints())...)
	stopTracing, err := tracing.Setup(ctx, getenv, "checkout-api")
	if err != nil {
		return err
	}
	defer tracing.Flush(stopTracing, logger)

	// Waits for PostgreSQL as the other processes do: an api started (or
	// restarted) while the database is away serves once it answers,
	// instead of exiting with an error that reads like a bad setting.
	db, err := postgres.OpenRetrying(ctx, postgres.Config{URL: s.DatabaseURL, MaxConns: s.DatabaseMaxConns}, logger)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for PostgreSQL
		}
		return fmt.Errorf("postgres: %w", err)
	}
	defer postgres.Close(db)
	if err := tracing.InstrumentGORM(db); err != nil {
		return err
	}
	if s.MigrateOnStart {
		if err := postgres.Migrate(ctx, db, logger); err != nil {
			return err
		}
	}

	redis.SetLogger(telemetry.RedisLogger(logger))
	rdb := newRedis()
	defer rdb.Close()
	if err := tracing.InstrumentRedis(rdb); err != nil {
		return err
	}

	reg := telemetry.NewRegistry()
	pay := payments.NewClient(payments.Config{
		APIBase:    s.StripeAPIBase,
		SecretKey:  s.StripeSecretKey,
		Timeout:    s.StripeTimeout,
		MaxElapsed: s.StripeMaxElapsed,
	}, logger, reg)

	app := api.New(api.Config{
		RedisKeyPrefix:   s.RedisKeyPrefix,
		TTL:              s.IdempotencyTTL,
		Lease:            s.IdempotencyLease,
		FailureMode:      mode,
		WorkTimeout:      s.WorkTimeout,
		WebhookSecret:    s.StripeWebhookSecret,
		RefundRetryAfter: s.RefundRetryAfter,
		Saga: checkout.SagaConfig{
			SearchSettle:  s.StripeSettle,
			UnknownAfter:  s.UnknownAfter,
			ActionTimeout: s.ActionTimeout,
		},
		RateLimits:       rateLimits,
		MaxBodyBytes:     s.HTTPMaxBodyBytes,
		MetricsElsewhere: s.MetricsAddr != "",
	}, api.Deps{DB: db, Redis: rdb, Payments: pay, Keys: keys, Logger: logger, Registry: reg})

	if s.MetricsAddr != "" {
		metricsSrv, err := telemetry.Serve(s.MetricsAddr, reg, app.Checks...)
		if err != nil {
			return fmt.Errorf("METRICS_ADDR: %w", err)
		}
		logger.Info("metrics listening", "addr", metricsSrv.Addr())
		defer func() {
			// After the drain: readiness stays answerable while it runs.
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			metricsSrv.Shutdown(shutdownCtx)
		}()
	}

	ln, err := net.Listen("tcp", s.HTTPAddr)
	if err != nil {
		return fmt.Errorf("HTTP_ADDR: %w", err)
	}
	srv := serverLimits.Server(app.Handler)
	// Requests in flight, for the log line of a drain that runs out of time.
	var inFlight atomic.Int64
	handler := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		handler.ServeHTTP(w, r)
	})
	logger.Info("listening", "addr", ln.Addr().String())

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	// Stop accepting, let in-flight checkouts finish (their work runs on
	// detached contexts), then close. A drain that outlasts
	// SHUTDOWN_TIMEOUT is not a failure (CONTRACT.md: exit 0): each request
	// still running holds its key at a recovery point, from which a retry
	// with the same key, or the worker's completer once the lease expires,
	// resumes it.
	logger.Info("shutting down", "timeout", s.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		if !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("shutdown: %w", err)
		}
		logger.Warn("shutdown timeout: requests still in flight are cut off; their keys stay at their recovery point, and a retry or the completer resumes them",
			"in_flight", inFlight.Load(), "timeout", s.ShutdownTimeout.String())
		srv.Close()
	}
	logger.Info("stopped")
	return nil
}
