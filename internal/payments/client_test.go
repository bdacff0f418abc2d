package payments_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/payments/stripeemu"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// bundle is a Client wired to its own emulator and metrics registry.
type bundle struct {
	emu    *stripeemu.Emulator
	client *payments.Client
	reg    *prometheus.Registry
	base   string
}

// setup starts an emulator and a client for it; cfg's APIBase and SecretKey
// are filled in, and zero timeouts get test-sized values.
func setup(t testing.TB, cfg payments.Config) bundle {
	t.Helper()
	emu := stripeemu.New()
	srv := httptest.NewServer(emu)
	t.Cleanup(srv.Close)
	cfg.APIBase, cfg.SecretKey = srv.URL, "sk_test_123"
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxElapsed == 0 {
		cfg.MaxElapsed = 5 * time.Second
	}
	reg := prometheus.NewRegistry()
	return bundle{emu: emu, client: payments.NewClient(cfg, slog.New(slog.DiscardHandler), reg), reg: reg, base: srv.URL}
}

// chargeReq is a valid request with a key unique to the test.
func chargeReq(t testing.TB, pm string) checkout.ChargeRequest {
	t.Helper()
	return checkout.ChargeRequest{
		IdempotencyKey: checkout.StepKey("acme", t.Name(), "ord_1", checkout.StepPaymentIntent),
		Amount:         2500,
		Currency:       "usd",
		PaymentMethod:  pm,
		OrderID:        "ord_1",
		TenantID:       "acme",
	}
}

// calls reads checkout_stripe_calls_total{result} from reg.
func calls(t testing.TB, reg *prometheus.Registry, result string) int {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "checkout_stripe_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	t.Fatalf("no checkout_stripe_calls_total{result=%q}", result)
	return 0
}

// requireSameRequests asserts that every logged request carried key and the
// same parameters: retries must be indistinguishable from the first attempt.
func requireSameRequests(t testing.TB, emu *stripeemu.Emulator, key string) {
	t.Helper()
	reqs := emu.Requests()
	require.NotEmpty(t, reqs)
	for i, r := range reqs {
		require.Equal(t, key, r.IdempotencyKey, "request %d", i)
		require.Equal(t, reqs[0].Params, r.Params, "request %d", i)
		require.Equal(t, "POST", r.Method)
		require.Equal(t, "/v1/payment_intents", r.Path)
	}
}

func TestCharge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		cfg          payments.Config
		faults       []stripeemu.Fault
		pm           string
		wantStatus   string
		wantDeclined bool
		wantCode     string
		wantRequests int
		wantReplayed int // requests answered from the idempotency store
		wantCalls    map[string]int
	}{
		{
			name: "succeeded", pm: "pm_card_visa", wantStatus: "succeeded", wantRequests: 1,
			wantCalls: map[string]int{"succeeded": 1},
		},
		{
			name: "declined with payment intent", pm: "pm_card_chargeDeclined", wantStatus: "requires_payment_method",
			wantDeclined: true, wantCode: "generic_decline", wantRequests: 1, wantCalls: map[string]int{"declined": 1},
		},
		{
			name: "requires action returned as is", pm: "pm_card_authenticationRequired", wantStatus: "requires_action",
			wantRequests: 1, wantCalls: map[string]int{"succeeded": 1},
		},
		{
			name: "succeeded after two 500s", pm: "pm_card_visa", wantStatus: "succeeded",
			faults:       []stripeemu.Fault{{Kind: stripeemu.FaultFail, Count: 2, Status: 500}},
			wantRequests: 3, wantCalls: map[string]int{"transient": 2, "succeeded": 1},
		},
		{
			name: "succeeded after 429 and 503", pm: "pm_card_visa", wantStatus: "succeeded",
			faults: []stripeemu.Fault{
				{Kind: stripeemu.FaultFail, Count: 1, Status: 429},
				{Kind: stripeemu.FaultFail, Count: 1, Status: 503},
			},
			wantRequests: 3, wantCalls: map[string]int{"transient": 2, "succeeded": 1},
		},
		{
			name: "succeeded by replay after dropped response", pm: "pm_card_visa", wantStatus: "succeeded",
			faults:       []stripeemu.Fault{{Kind: stripeemu.FaultDrop, Count: 1}},
			wantRequests: 2, wantReplayed: 1, wantCalls: map[string]int{"transient": 1, "succeeded": 1},
		},
		{
			name: "declined by replay after dropped response", pm: "pm_card_chargeDeclined", wantStatus: "requires_payment_method",
			wantDeclined: true, wantCode: "generic_decline",
			faults:       []stripeemu.Fault{{Kind: stripeemu.FaultDrop, Count: 1}},
			wantRequests: 2, wantReplayed: 1, wantCalls: map[string]int{"transient": 1, "declined": 1},
		},
		{
			name: "succeeded by replay after timeout once charged", pm: "pm_card_visa", wantStatus: "succeeded",
			cfg:          payments.Config{Timeout: 150 * time.Millisecond},
			faults:       []stripeemu.Fault{{Kind: stripeemu.FaultDelay, Count: 1, After: 600 * time.Millisecond}},
			wantRequests: 2, wantReplayed: 1, wantCalls: map[string]int{"transient": 1, "succeeded": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.cfg)
			for _, f := range tt.faults {
				require.NoError(t, b.emu.Inject(f))
			}
			req := chargeReq(t, tt.pm)

			res, err := b.client.Charge(t.Context(), req)

			require.NoError(t, err)
			require.Regexp(t, `^pi_`, res.PaymentIntentID)
			require.Equal(t, tt.wantStatus, res.Status)
			require.Equal(t, tt.wantDeclined, res.Declined)
			require.Equal(t, tt.wantCode, res.DeclineCode)
			require.Equal(t, 1, b.emu.Created(req.IdempotencyKey), "exactly one PaymentIntent for the key")
			require.Equal(t, 1, b.emu.TotalCreated())

			// Delayed responses are logged before the delay ends.
			require.Eventually(t, func() bool { return len(b.emu.Requests()) == tt.wantRequests }, 2*time.Second, 10*time.Millisecond)
			requireSameRequests(t, b.emu, req.IdempotencyKey)
			replayed := 0
			for _, r := range b.emu.Requests() {
				if r.Replayed {
					replayed++
					require.Equal(t, res.PaymentIntentID, r.PaymentIntentID)
				}
			}
			require.Equal(t, tt.wantReplayed, replayed)
			for _, result := range []string{"succeeded", "declined", "transient", "rejected"} {
				require.Equal(t, tt.wantCalls[result], calls(t, b.reg, result), result)
			}
		})
	}
}

func TestChargeSentParams(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{})
	req := chargeReq(t, "pm_card_visa")
	_, err := b.client.Charge(t.Context(), req)
	require.NoError(t, err)
	reqs := b.emu.Requests()
	require.Len(t, reqs, 1)
	require.Equal(t, "amount=2500&confirm=true&currency=usd&metadata%5Border_id%5D=ord_1&metadata%5Btenant_id%5D=acme"+
		"&payment_method=pm_card_visa&payment_method_types%5B0%5D=card", reqs[0].Params)
}

func TestChargeFails(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		cfg         payments.Config
		faults      []stripeemu.Fault
		mutate      func(*checkout.ChargeRequest)
		secretKey   string
		wantErr     error
		wantMaxPIs  int
		wantMaxReqs int // upper bound on HTTP requests; 0 = no bound
	}{
		{
			name:    "unavailable after 5xx until max elapsed",
			cfg:     payments.Config{MaxElapsed: 400 * time.Millisecond},
			faults:  []stripeemu.Fault{{Kind: stripeemu.FaultFail, Status: 503}},
			wantErr: payments.ErrUnavailable, wantMaxPIs: 0,
		},
		{
			name:    "unavailable after timeouts until max elapsed",
			cfg:     payments.Config{Timeout: 100 * time.Millisecond, MaxElapsed: 400 * time.Millisecond},
			faults:  []stripeemu.Fault{{Kind: stripeemu.FaultDelay, Before: 1200 * time.Millisecond}},
			wantErr: payments.ErrUnavailable, wantMaxPIs: 1,
		},
		{
			name:    "rejected without idempotency key",
			mutate:  func(r *checkout.ChargeRequest) { r.IdempotencyKey = " " },
			wantErr: payments.ErrRejected, wantMaxReqs: 0,
		},
		{
			name:    "rejected on invalid request without retry",
			mutate:  func(r *checkout.ChargeRequest) { r.Amount = 0 },
			wantErr: payments.ErrRejected, wantMaxReqs: 1,
		},
		{
			name:      "rejected on invalid api key without retry",
			secretKey: "pk_test_wrong",
			wantErr:   payments.ErrRejected, wantMaxReqs: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.cfg)
			client := b.client
			if tt.secretKey != "" {
				client = payments.NewClient(payments.Config{APIBase: b.base, SecretKey: tt.secretKey}, nil, nil)
			}
			for _, f := range tt.faults {
				require.NoError(t, b.emu.Inject(f))
			}
			req := chargeReq(t, "pm_card_visa")
			if tt.mutate != nil {
				tt.mutate(&req)
			}

			res, err := client.Charge(t.Context(), req)

			require.ErrorIs(t, err, tt.wantErr)
			require.Zero(t, res)
			require.LessOrEqual(t, b.emu.Created(req.IdempotencyKey), tt.wantMaxPIs)
			if tt.wantErr == payments.ErrRejected {
				require.NotErrorIs(t, err, payments.ErrUnavailable)
				require.Len(t, b.emu.Requests(), tt.wantMaxReqs, "a rejection is not retried")
			} else {
				requireSameRequests(t, b.emu, req.IdempotencyKey)
			}
		})
	}
}

func TestChargeSameKeyOtherAmountIsRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{})
	req := chargeReq(t, "pm_card_visa")
	first, err := b.client.Charge(t.Context(), req)
	require.NoError(t, err)

	req.Amount++
	_, err = b.client.Charge(t.Context(), req)

	require.ErrorIs(t, err, payments.ErrRejected)
	require.Equal(t, 1, b.emu.Created(req.IdempotencyKey))
	require.Len(t, b.emu.Requests(), 2, "an idempotency_error is not retried")
	require.Equal(t, 1, calls(t, b.reg, "rejected"))

	req.Amount--
	again, err := b.client.Charge(t.Context(), req)
	require.NoError(t, err)
	require.Equal(t, first, again, "the original request still replays")
}

func TestChargeConcurrentSameKeyWaitsForInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{})
	// The first attempt holds the key long enough for the second to get 409.
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 500 * time.Millisecond}))
	req := chargeReq(t, "pm_card_visa")

	var wg sync.WaitGroup
	var first checkout.ChargeResult
	var firstErr error
	wg.Go(func() { first, firstErr = b.client.Charge(t.Context(), req) })
	require.Eventually(t, func() bool { return b.emu.InFlight() == 1 }, 2*time.Second, 5*time.Millisecond)
	second, secondErr := b.client.Charge(t.Context(), req)
	wg.Wait()

	require.NoError(t, firstErr)
	require.NoError(t, secondErr)
	require.Equal(t, first, second)
	require.Equal(t, "succeeded", second.Status)
	require.Equal(t, 1, b.emu.Created(req.IdempotencyKey))
	requireSameRequests(t, b.emu, req.IdempotencyKey)
	statuses := map[int]int{}
	for _, r := range b.emu.Requests() {
		statuses[r.Status]++
	}
	require.Positive(t, statuses[409], "the second call met the first in flight")
	require.Equal(t, statuses[409], calls(t, b.reg, "transient"))
}

func TestChargeHonorsContextCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{Timeout: 5 * time.Second, MaxElapsed: 30 * time.Second})
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 500}))
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		// Cancel once the client is retrying.
		for len(b.emu.Requests()) < 2 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()

	start := time.Now()
	_, err := b.client.Charge(ctx, chargeReq(t, "pm_card_visa"))

	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, payments.ErrUnavailable)
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestChargeHonorsContextDeadlineDuringAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{Timeout: 5 * time.Second, MaxElapsed: 30 * time.Second})
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, After: 700 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	defer cancel()

	_, err := b.client.Charge(ctx, chargeReq(t, "pm_card_visa"))

	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	require.ErrorIs(t, err, payments.ErrUnavailable)
}

func TestNewClientSharesMetricsOnOneRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	require.NotPanics(t, func() {
		payments.NewClient(payments.Config{}, nil, reg)
		payments.NewClient(payments.Config{}, nil, reg)
	})
	require.Equal(t, 0, calls(t, reg, "succeeded"))
}
