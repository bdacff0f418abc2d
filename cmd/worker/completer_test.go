package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/api"
	"github.com/onceonly/checkout/internal/auth"
	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/telemetry"
	"github.com/onceonly/checkout/internal/testenv"
)

// TestWorkerCompletesAnInterruptedCancel: a customer cancels an order that
// waits for 3D Secure while Stripe is down (502, the key left at
// cancel_requested) and never retries. The worker's completer, as cmd/worker
// wires it, resumes the cancellation: the PaymentIntent canceled at Stripe
// (requested_by_customer), so the customer can no longer pay the order
// they asked to cancel, the order canceled, and the stored 200 replayed to
// the client's late retry. Before, the worker resumed only checkout and
// refund keys, and this one waited for PAYMENT_ACTION_TIMEOUT.
func TestWorkerCompletesAnInterruptedCancel(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.NewDB(t)
	emu := stripeemu.New()
	emuSrv := httptest.NewServer(emu)
	t.Cleanup(emuSrv.Close)
	t.Cleanup(emu.Close)
	rdb, prefix := testenv.Redis(t)
	keys, err := auth.ParseKeys(auth.DefaultKeys)
	require.NoError(t, err)
	logger := telemetry.NewLogger(io.Discard, slog.LevelInfo)
	pay := payments.NewClient(payments.Config{APIBase: emuSrv.URL, SecretKey: "sk_test_123",
		Timeout: time.Second, MaxElapsed: 100 * time.Millisecond}, logger, nil)
	a := api.New(api.Config{RedisKeyPrefix: prefix, TTL: 24 * time.Hour, Lease: 5 * time.Second,
		FailureMode: idempotency.FailClosed, WorkTimeout: 30 * time.Second},
		api.Deps{DB: db, Redis: rdb, Payments: pay, Keys: keys, Logger: logger})
	srv := httptest.NewServer(a.Handler)
	t.Cleanup(srv.Close)
	post := func(path, key, body string) (int, http.Header, []byte) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewBufferString(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, b
	}

	status, _, body := post("/v1/checkouts", "checkout-3ds",
		`{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":1}],"payment_method":"pm_card_authenticationRequired"}`)
	require.Equal(t, http.StatusAccepted, status, "%s", body)
	var o orders.Order
	require.NoError(t, json.Unmarshal(body, &o))
	require.Equal(t, orders.RequiresAction, o.Status)

	require.NoError(t, emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPICancel, Status: 503}))
	status, _, body = post("/v1/orders/"+o.ID+"/cancel", "cancel-1", `{}`)
	require.Equal(t, http.StatusBadGateway, status, "%s", body)
	emu.ClearFaults()
	// The process that answered died: its lease is long gone.
	require.NoError(t, db.Exec(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 hour'
		WHERE key = 'cancel-1' AND recovery_point = ?`, checkout.RecoveryPointCancelRequested).Error)

	env, _, _ := workerEnv(t, dbURL, map[string]string{"SMTP_FROM": "shop@example.com",
		"STRIPE_API_BASE": emuSrv.URL, "COMPLETER_INTERVAL": "100ms"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, getenv(env), io.Discard) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("the worker did not stop within 20s")
		}
	})

	require.Eventually(t, func() bool {
		var n int64
		db.Raw(`SELECT count(*) FROM idempotency_keys WHERE key = 'cancel-1' AND recovery_point = 'finished' AND response_status = 200`).Scan(&n)
		return n == 1
	}, 20*time.Second, 50*time.Millisecond, "the worker's completer finishes the cancel key")

	var pi struct{ Status, Reason string }
	for _, p := range emu.PaymentIntents() {
		if p.ID == o.Payment.PaymentIntentID {
			pi.Status, pi.Reason = string(p.Status), string(p.CancellationReason)
		}
	}
	require.Equal(t, struct{ Status, Reason string }{"canceled", "requested_by_customer"}, pi, "canceled at Stripe")
	var orderStatus string
	require.NoError(t, db.Raw(`SELECT status FROM orders WHERE id = ?`, o.ID).Scan(&orderStatus).Error)
	require.Equal(t, string(orders.Canceled), orderStatus)

	status, header, body := post("/v1/orders/"+o.ID+"/cancel", "cancel-1", `{}`)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Equal(t, "true", header.Get(idempotency.ReplayedHeader))
	var canceled orders.Order
	require.NoError(t, json.Unmarshal(body, &canceled))
	require.Equal(t, orders.Canceled, canceled.Status)
}
