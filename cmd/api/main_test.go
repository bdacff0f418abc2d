package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	checkoutpkg "github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/testenv"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestConfigErrorsNameTheVariable: a bad value stops the process at start
// with a message naming the variable.
func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"bad duration", map[string]string{"IDEMPOTENCY_TTL": "soon"}, "IDEMPOTENCY_TTL"},
		{"bad failure mode", map[string]string{"DEDUP_FAILURE_MODE": "maybe"}, "DEDUP_FAILURE_MODE"},
		{"bad api keys", map[string]string{"CHECKOUT_API_KEYS": "no-colon"}, "CHECKOUT_API_KEYS"},
		{"default keys in production", map[string]string{"APP_ENV": "production"}, "CHECKOUT_API_KEYS"},
		{"one development key in production", map[string]string{"APP_ENV": "production", "CHECKOUT_API_KEYS": "acme:sk_live_real, other:sk_test_acme"}, "CHECKOUT_API_KEYS"},
		{"development keys swapped in production", map[string]string{"APP_ENV": "production", "CHECKOUT_API_KEYS": "globex:sk_test_globex,acme:sk_test_acme"}, "CHECKOUT_API_KEYS"},
		{"Stripe API base not a URL", map[string]string{"STRIPE_API_BASE": "notaurl"}, "STRIPE_API_BASE"},
		{"Stripe API base over ftp", map[string]string{"STRIPE_API_BASE": "ftp://x"}, "STRIPE_API_BASE"},
		{"Stripe API base without a host", map[string]string{"STRIPE_API_BASE": "https://"}, "STRIPE_API_BASE"},
		{"Stripe API base without a scheme", map[string]string{"STRIPE_API_BASE": "api.stripe.com"}, "STRIPE_API_BASE"},
		{"APP_ENV abbreviated", map[string]string{"APP_ENV": "prod"}, `APP_ENV: "prod" is not one of development, production`},
		{"APP_ENV capitalised", map[string]string{"APP_ENV": "Production"}, "APP_ENV"},
		{"APP_ENV with a space", map[string]string{"APP_ENV": "production "}, "APP_ENV"},
		{"APP_ENV unknown", map[string]string{"APP_ENV": "staging"}, "APP_ENV"},
		{"zero Stripe timeout", map[string]string{"STRIPE_TIMEOUT": "0s"}, "STRIPE_TIMEOUT"},
		{"an attempt longer than all retries", map[string]string{"STRIPE_TIMEOUT": "30s", "STRIPE_MAX_ELAPSED": "1s"}, "STRIPE_TIMEOUT"},
		{"work cut off before Stripe gives up", map[string]string{"WORK_TIMEOUT": "1s"}, "WORK_TIMEOUT"},
		{"negative search settle", map[string]string{"STRIPE_SEARCH_SETTLE": "-1s"}, "STRIPE_SEARCH_SETTLE"},
		{"zero unknown-after", map[string]string{"PAYMENT_UNKNOWN_AFTER": "0s"}, "PAYMENT_UNKNOWN_AFTER"},
		{"unparsable action timeout", map[string]string{"PAYMENT_ACTION_TIMEOUT": "half an hour"}, "PAYMENT_ACTION_TIMEOUT"},
		{"lease longer than the TTL", map[string]string{"IDEMPOTENCY_TTL": "10s", "IDEMPOTENCY_LEASE": "1m"}, "IDEMPOTENCY_TTL"},
		{"bad redis url", map[string]string{"REDIS_URL": "http://x"}, "REDIS_URL"},
		// Checked before the api waits for the database, which would
		// retry a malformed URL for ever.
		{"bad database url", map[string]string{"DATABASE_URL": "postgres://db:notaport/checkout"}, "DATABASE_URL"},
		{"bad log level", map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{"empty webhook secret", map[string]string{"STRIPE_WEBHOOK_SECRET": "whsec_"}, "STRIPE_WEBHOOK_SECRET"},
		{"an API key as webhook secret", map[string]string{"STRIPE_WEBHOOK_SECRET": "sk_test_123"}, "STRIPE_WEBHOOK_SECRET"},
		{"development webhook secret in production", map[string]string{"APP_ENV": "production", "CHECKOUT_API_KEYS": "acme:sk_live_real"}, "STRIPE_WEBHOOK_SECRET"},
		{"bad rate limit", map[string]string{"RATE_LIMIT": "200"}, "RATE_LIMIT: "},
		{"bad tenant rate limit", map[string]string{"RATE_LIMIT_TENANTS": "acme:50/s,globex"}, "RATE_LIMIT_TENANTS"},
		{"bad replay rate limit", map[string]string{"RATE_LIMIT_REPLAY": "1/day"}, "RATE_LIMIT_REPLAY"},
		{"tiny header limit", map[string]string{"HTTP_MAX_HEADER_BYTES": "10"}, "HTTP_MAX_HEADER_BYTES"},
		{"tiny body limit", map[string]string{"HTTP_MAX_BODY_BYTES": "10"}, "HTTP_MAX_BODY_BYTES"},
		{"zero read-header timeout", map[string]string{"HTTP_READ_HEADER_TIMEOUT": "0s"}, "HTTP_READ_HEADER_TIMEOUT"},
		{"read-header timeout beyond the read timeout", map[string]string{"HTTP_READ_HEADER_TIMEOUT": "20s", "HTTP_READ_TIMEOUT": "10s"}, "HTTP_READ_HEADER_TIMEOUT"},
		{"write timeout shorter than the work", map[string]string{"HTTP_WRITE_TIMEOUT": "30s"}, "HTTP_WRITE_TIMEOUT"},
		{"zero idle timeout", map[string]string{"HTTP_IDLE_TIMEOUT": "0s"}, "HTTP_IDLE_TIMEOUT"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), env(tc.env), io.Discard)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestAppEnvValues: APP_ENV is development (also when unset or empty) or
// production, and production refuses the development keys and secret.
func TestAppEnvValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "development"},
		{map[string]string{"APP_ENV": ""}, "development"},
		{map[string]string{"APP_ENV": "development"}, "development"},
		{map[string]string{"APP_ENV": "production", "CHECKOUT_API_KEYS": "acme:sk_live_real",
			"STRIPE_WEBHOOK_SECRET": "whsec_real"}, "production"},
	} {
		var s settings
		require.NoError(t, config.Load(env(tc.env), &s))
		require.Equal(t, tc.want, s.AppEnv)
		_, _, err := s.check()
		require.NoError(t, err, "%v", tc.env)
	}
}

// TestGracefulShutdown: on SIGTERM (ctx cancelled) the API stops accepting,
// finishes the checkout in flight, and run returns nil (exit 0).
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	_, dbURL := pgtest.NewDB(t)
	_, prefix := testenv.Redis(t)
	emu := stripeemu.New()
	require.NoError(t, emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: time.Second}))
	emuSrv := httptest.NewServer(emu)
	t.Cleanup(emuSrv.Close)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	lines, done := runAPI(ctx, map[string]string{
		"HTTP_ADDR":        "127.0.0.1:0",
		"DATABASE_URL":     dbURL,
		"REDIS_URL":        testenv.RedisURL(),
		"REDIS_KEY_PREFIX": prefix,
		"STRIPE_API_BASE":  emuSrv.URL,
	})
	base := "http://" + waitForLog(t, lines, done, "listening")

	result := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/checkouts", strings.NewReader(
			`{"email":"buyer@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_visa"}`))
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		req.Header.Set("Idempotency-Key", "drain-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			result <- 0
			return
		}
		resp.Body.Close()
		result <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return emu.InFlight() == 1 }, 10*time.Second, 10*time.Millisecond)
	stop() // SIGTERM
	require.Equal(t, http.StatusCreated, <-result, "the checkout in flight finishes")
	require.NoError(t, <-done, "exit 0")
	require.Equal(t, 1, emu.TotalCreated())
	_, err := http.Get(base + "/healthz")
	require.Error(t, err, "no longer accepting")
}

// TestRefundRetryAfterDefault: REFUND_RETRY_AFTER's default is the refund
// service's own (refunds.DefaultRetryAfter, the 24 hours Stripe keeps a
// key's stored answer at least), so the two cannot drift apart.
func TestRefundRetryAfterDefault(t *testing.T) {
	t.Parallel()
	var s settings
	require.NoError(t, config.Load(func(string) string { return "" }, &s))
	require.Equal(t, refunds.DefaultRetryAfter, s.RefundRetryAfter)
}

// TestShutdownTimeoutExitsZeroAndLeavesTheKeyResumable: a checkout that
// outlasts SHUTDOWN_TIMEOUT (Stripe slower than the drain) does not make the
// api fail: run returns nil (exit 0) after logging a warning with the
// requests still in flight. The cut-off checkout wrote nothing half-way: its
// key is unfinished at its recovery point with its order pending, and a
// retry with the same key on another api, once the lease expired, finishes
// it with the one PaymentIntent.
func TestShutdownTimeoutExitsZeroAndLeavesTheKeyResumable(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.NewDB(t)
	_, prefix := testenv.Redis(t)
	emu := stripeemu.New()
	require.NoError(t, emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 3 * time.Second}))
	emuSrv := httptest.NewServer(emu)
	t.Cleanup(emuSrv.Close)
	vars := env(map[string]string{
		"HTTP_ADDR":         "127.0.0.1:0",
		"DATABASE_URL":      dbURL,
		"REDIS_URL":         testenv.RedisURL(),
		"REDIS_KEY_PREFIX":  prefix,
		"STRIPE_API_BASE":   emuSrv.URL,
		"SHUTDOWN_TIMEOUT":  "300ms",
		"IDEMPOTENCY_LEASE": "1s",
	})
	start := func(ctx context.Context, out *testenv.Output) (string, chan error) {
		done := make(chan error, 1)
		go func() { done <- run(ctx, vars, out) }()
		return "http://" + testenv.LogValue(t, out, "listening", "addr"), done
	}
	const body = `{"email":"buyer@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_visa"}`
	checkout := func(base string) (int, error) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/checkouts", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		req.Header.Set("Idempotency-Key", "drain-timeout-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	out := &testenv.Output{}
	base, done := start(ctx, out)
	result := make(chan error, 1)
	go func() {
		status, err := checkout(base)
		if err == nil {
			err = fmt.Errorf("answered %d", status)
		}
		result <- err
	}()
	require.Eventually(t, func() bool { return emu.InFlight() == 1 }, 10*time.Second, 10*time.Millisecond)
	stop() // SIGTERM
	select {
	case err := <-done:
		require.NoError(t, err, "exit 0 when the drain outlasts SHUTDOWN_TIMEOUT")
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after SHUTDOWN_TIMEOUT")
	}
	require.Regexp(t, `"level":"WARN","msg":"shutdown timeout: [^"]*","in_flight":1,`, out.String())
	require.Error(t, <-result, "the cut-off checkout got no answer")

	// The first create reaches Stripe after the api stopped; whatever the
	// cut-off request does next, it cannot write any more.
	require.Eventually(t, func() bool { return emu.InFlight() == 0 }, 10*time.Second, 10*time.Millisecond)
	var key struct {
		RecoveryPoint  string
		OrderID        *string
		ResponseStatus *int
	}
	require.NoError(t, db.Raw(`SELECT recovery_point, order_id, response_status FROM idempotency_keys
		WHERE key = 'drain-timeout-1'`).Scan(&key).Error)
	require.Equal(t, checkoutpkg.RecoveryPointOrderCreated, key.RecoveryPoint, "unfinished, at its recovery point")
	require.Nil(t, key.ResponseStatus, "no response stored")
	require.NotNil(t, key.OrderID)
	var orders []struct{ ID, Status string }
	require.NoError(t, db.Raw(`SELECT id, status FROM orders`).Scan(&orders).Error)
	require.Len(t, orders, 1)
	require.Equal(t, *key.OrderID, orders[0].ID)
	require.Equal(t, "pending_payment", orders[0].Status)

	// Another api resumes it once the lease has expired.
	ctx2, stop2 := context.WithCancel(context.Background())
	base2, done2 := start(ctx2, &testenv.Output{})
	var status int
	require.Eventually(t, func() bool {
		var err error
		status, err = checkout(base2)
		return err == nil && status != http.StatusConflict
	}, 20*time.Second, 200*time.Millisecond)
	require.Equal(t, http.StatusCreated, status, "resumed")
	require.Equal(t, 1, emu.TotalCreated(), "one PaymentIntent")
	require.NoError(t, db.Raw(`SELECT id, status FROM orders`).Scan(&orders).Error)
	require.Len(t, orders, 1)
	require.Equal(t, "paid", orders[0].Status)
	stop2()
	require.NoError(t, <-done2)
}

// TestMigrateOnStart: by default the api applies the migrations before it
// serves; with MIGRATE_ON_START=false it leaves an empty database empty
// (cmd/migrate's job), and still starts.
func TestMigrateOnStart(t *testing.T) {
	t.Parallel()
	schema := func(dbURL string) bool {
		conn, err := pgx.Connect(context.Background(), dbURL)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		var exists bool
		require.NoError(t, conn.QueryRow(context.Background(), `SELECT to_regclass('public.orders') IS NOT NULL`).Scan(&exists))
		return exists
	}
	for _, tc := range []struct {
		value string
		want  bool
	}{{"", true}, {"true", true}, {"false", false}} {
		t.Run("MIGRATE_ON_START="+tc.value, func(t *testing.T) {
			t.Parallel()
			dbURL := pgtest.NewEmptyDB(t)
			startAPI(t, map[string]string{"DATABASE_URL": dbURL, "MIGRATE_ON_START": tc.value})
			require.Equal(t, tc.want, schema(dbURL))
		})
	}
}
