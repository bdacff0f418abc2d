package payments_test

import (
	"context"
	"encoding/json"
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
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/stripestep"
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

// createReq is a valid create request with a key unique to the test.
func createReq(t testing.TB, pm string) checkout.CreateIntentRequest {
	t.Helper()
	return checkout.CreateIntentRequest{
		IdempotencyKey: stripestep.Key("ord_"+t.Name(), stripestep.StepCreate, 1),
		Amount:         2500,
		Currency:       "usd",
		PaymentMethod:  pm,
		OrderID:        "ord_1",
		TenantID:       "acme",
	}
}

// calls reads checkout_stripe_calls_total{op,result} from reg.
func calls(t testing.TB, reg *prometheus.Registry, op, result string) int {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "checkout_stripe_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			if have["op"] == op && have["result"] == result {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	t.Fatalf("no checkout_stripe_calls_total{op=%q,result=%q}", op, result)
	return 0
}

// requireSameRequests asserts that every logged request on path carried key
// and the same parameters: retries must be indistinguishable from the first
// attempt.
func requireSameRequests(t testing.TB, emu *stripeemu.Emulator, path, key string) []stripeemu.Request {
	t.Helper()
	var reqs []stripeemu.Request
	for _, r := range emu.Requests() {
		if r.Path == path {
			reqs = append(reqs, r)
		}
	}
	require.NotEmpty(t, reqs)
	for i, r := range reqs {
		require.Equal(t, key, r.IdempotencyKey, "request %d", i)
		require.Equal(t, reqs[0].Params, r.Params, "request %d", i)
		require.Equal(t, "POST", r.Method)
	}
	return reqs
}

// TestCreateAndConfirm: each step is its own call with its own key; the
// outcome of a confirm is the PaymentIntent's status, a decline is a
// refusal that names the PaymentIntent.
func TestCreateAndConfirm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		pm          string
		wantStatus  stripeintent.Status
		wantDecline string
		wantAction  bool
	}{
		{name: "succeeded", pm: "pm_card_visa", wantStatus: stripeintent.Succeeded},
		{name: "declined", pm: "pm_card_chargeDeclined", wantDecline: "generic_decline"},
		{name: "3D Secure requires action", pm: "pm_card_authenticationRequired", wantStatus: stripeintent.RequiresAction, wantAction: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, payments.Config{})
			req := createReq(t, tt.pm)
			pi, err := b.client.CreatePaymentIntent(t.Context(), req)
			require.NoError(t, err)
			require.Regexp(t, `^pi_`, pi.ID)
			require.Equal(t, stripeintent.RequiresConfirmation, pi.Status, "created unconfirmed: no money moves")
			require.Equal(t, map[string]string{"order_id": "ord_1", "tenant_id": "acme"}, pi.Metadata)

			key := stripestep.Key("ord_1", stripestep.StepConfirm, 1)
			got, err := b.client.ConfirmPaymentIntent(t.Context(), checkout.ConfirmIntentRequest{IdempotencyKey: key, PaymentIntentID: pi.ID})
			if tt.wantDecline != "" {
				var refusal *checkout.PaymentRefusal
				require.ErrorAs(t, err, &refusal)
				require.True(t, refusal.Declined)
				require.Equal(t, tt.wantDecline, refusal.DeclineCode)
				require.NotNil(t, refusal.PaymentIntent)
				require.Equal(t, pi.ID, refusal.PaymentIntent.ID)
				require.Equal(t, 1, calls(t, b.reg, "confirm", "declined"))
				return
			}
			require.NoError(t, err)
			require.Equal(t, pi.ID, got.ID)
			require.Equal(t, tt.wantStatus, got.Status)
			if tt.wantAction {
				var next struct {
					Type string `json:"type"`
				}
				require.NoError(t, json.Unmarshal(got.NextAction, &next), "next_action as Stripe sent it")
				require.Equal(t, "use_stripe_sdk", next.Type)
				require.Regexp(t, `^`+pi.ID+`_secret_`, got.ClientSecret)
			}
			require.Equal(t, 1, calls(t, b.reg, "create", "succeeded"))
			require.Equal(t, 1, calls(t, b.reg, "confirm", "succeeded"))

			read, err := b.client.RetrievePaymentIntent(t.Context(), pi.ID)
			require.NoError(t, err)
			require.Equal(t, tt.wantStatus, read.Status)
		})
	}
}

// TestCreateSentParams pins the create request's form: confirm=false and
// the metadata every PaymentIntent of the checkout carries.
func TestCreateSentParams(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{})
	_, err := b.client.CreatePaymentIntent(t.Context(), createReq(t, "pm_card_visa"))
	require.NoError(t, err)
	reqs := b.emu.Requests()
	require.Len(t, reqs, 1)
	require.Equal(t, "amount=2500&confirm=false&currency=usd&metadata%5Border_id%5D=ord_1&metadata%5Btenant_id%5D=acme"+
		"&payment_method=pm_card_visa&payment_method_types%5B0%5D=card", reqs[0].Params)
}

// TestTransientRetriedWithSameKey: failures Stripe does not store are
// retried with the same key and parameters until a final answer.
func TestTransientRetriedWithSameKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		cfg          payments.Config
		faults       []stripeemu.Fault
		wantRequests int
		wantReplayed int
		wantCalls    map[string]int
	}{
		{
			name: "429 and 503",
			faults: []stripeemu.Fault{
				{Kind: stripeemu.FaultFail, Count: 1, Status: 429},
				{Kind: stripeemu.FaultFail, Count: 1, Status: 503},
			},
			wantRequests: 3, wantCalls: map[string]int{"transient": 2, "succeeded": 1},
		},
		{
			name:         "dropped response replayed",
			faults:       []stripeemu.Fault{{Kind: stripeemu.FaultDrop, Count: 1}},
			wantRequests: 2, wantReplayed: 1, wantCalls: map[string]int{"transient": 1, "succeeded": 1},
		},
		{
			name:         "timeout once executed, replayed",
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
			req := createReq(t, "pm_card_visa")
			pi, err := b.client.CreatePaymentIntent(t.Context(), req)
			require.NoError(t, err)
			require.Equal(t, 1, b.emu.TotalCreated(), "one PaymentIntent")
			// Delayed responses are logged before the delay ends.
			require.Eventually(t, func() bool { return len(b.emu.Requests()) == tt.wantRequests }, 2*time.Second, 10*time.Millisecond)
			reqs := requireSameRequests(t, b.emu, "/v1/payment_intents", req.IdempotencyKey)
			replayed := 0
			for _, r := range reqs {
				if r.Replayed {
					replayed++
					require.Equal(t, pi.ID, r.PaymentIntentID)
				}
			}
			require.Equal(t, tt.wantReplayed, replayed)
			for _, res := range []string{"succeeded", "transient", "indeterminate", "rejected"} {
				require.Equal(t, tt.wantCalls[res], calls(t, b.reg, "create", res), res)
			}
		})
	}
}

// TestFinalAnswersNotRetried: a 500 (stored by Stripe under the key) is
// indeterminate and a 4xx a refusal: one request each, never retried.
func TestFinalAnswersNotRetried(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		fault     *stripeemu.Fault
		mutate    func(*checkout.CreateIntentRequest)
		secretKey string
		wantErr   error
		wantCode  string
		wantReqs  int
		// wantResult is the result label the call is counted under.
		wantResult string
	}{
		{name: "500 is indeterminate", fault: &stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 500},
			wantErr: payments.ErrIndeterminate, wantReqs: 1},
		{name: "502 is indeterminate", fault: &stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 502},
			wantErr: payments.ErrIndeterminate, wantReqs: 1},
		{name: "no idempotency key", mutate: func(r *checkout.CreateIntentRequest) { r.IdempotencyKey = " " },
			wantErr: payments.ErrNoIdempotencyKey, wantReqs: 0},
		{name: "invalid request rejected", mutate: func(r *checkout.CreateIntentRequest) { r.Amount = 0 },
			wantCode: "amount_too_small", wantReqs: 1},
		// Our own key refused is not a refusal of the payment.
		{name: "invalid api key refused", secretKey: "pk_test_wrong", wantErr: stripestep.ErrCredentials, wantReqs: 1},
		{name: "401 expired key", fault: &stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 401},
			wantErr: stripestep.ErrCredentials, wantReqs: 1, wantResult: "credentials_refused"},
		{name: "403 restricted key", fault: &stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 403},
			wantErr: stripestep.ErrCredentials, wantReqs: 1, wantResult: "credentials_refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, payments.Config{})
			client := b.client
			if tt.secretKey != "" {
				client = payments.NewClient(payments.Config{APIBase: b.base, SecretKey: tt.secretKey}, nil, nil)
			}
			if tt.fault != nil {
				require.NoError(t, b.emu.Inject(*tt.fault))
			}
			req := createReq(t, "pm_card_visa")
			if tt.mutate != nil {
				tt.mutate(&req)
			}
			_, err := client.CreatePaymentIntent(t.Context(), req)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
			} else {
				var refusal *checkout.PaymentRefusal
				require.ErrorAs(t, err, &refusal)
				require.False(t, refusal.Declined)
				require.Equal(t, tt.wantCode, refusal.Code)
			}
			require.NotErrorIs(t, err, payments.ErrUnavailable)
			require.Len(t, b.emu.Requests(), tt.wantReqs, "a final answer is not retried")
			if tt.wantResult != "" {
				require.Equal(t, 1, calls(t, b.reg, "create", tt.wantResult))
			}
		})
	}
}

// TestUnansweredUntilMaxElapsed: Stripe down (503, or slower than the
// per-attempt timeout) ends in ErrUnavailable after MaxElapsed, every
// attempt with the same key.
func TestUnansweredUntilMaxElapsed(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg   payments.Config
		fault stripeemu.Fault
	}{
		"503":      {payments.Config{MaxElapsed: 400 * time.Millisecond}, stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 503}},
		"timeouts": {payments.Config{Timeout: 100 * time.Millisecond, MaxElapsed: 400 * time.Millisecond}, stripeemu.Fault{Kind: stripeemu.FaultDelay, Before: 1200 * time.Millisecond}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.cfg)
			require.NoError(t, b.emu.Inject(tc.fault))
			req := createReq(t, "pm_card_visa")
			_, err := b.client.CreatePaymentIntent(t.Context(), req)
			require.ErrorIs(t, err, payments.ErrUnavailable)
			// Delayed requests are logged when their delay ends.
			require.Eventually(t, func() bool { return len(b.emu.Requests()) >= 2 }, 3*time.Second, 10*time.Millisecond, "retried")
			requireSameRequests(t, b.emu, "/v1/payment_intents", req.IdempotencyKey)
		})
	}
}

func TestConcurrentSameKeyWaitsForInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{})
	// The first attempt holds the key long enough for the second to get 409.
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 500 * time.Millisecond}))
	req := createReq(t, "pm_card_visa")

	var wg sync.WaitGroup
	var first checkout.PaymentIntentState
	var firstErr error
	wg.Go(func() { first, firstErr = b.client.CreatePaymentIntent(t.Context(), req) })
	require.Eventually(t, func() bool { return b.emu.InFlight() == 1 }, 2*time.Second, 5*time.Millisecond)
	second, secondErr := b.client.CreatePaymentIntent(t.Context(), req)
	wg.Wait()

	require.NoError(t, firstErr)
	require.NoError(t, secondErr)
	require.Equal(t, first.ID, second.ID)
	require.Equal(t, 1, b.emu.TotalCreated())
	statuses := map[int]int{}
	for _, r := range b.emu.Requests() {
		statuses[r.Status]++
	}
	require.Positive(t, statuses[409], "the second call met the first in flight")
	require.Equal(t, statuses[409], calls(t, b.reg, "create", "transient"))
}

func TestHonorsContextCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{Timeout: 5 * time.Second, MaxElapsed: 30 * time.Second})
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 503}))
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		// Cancel once the client is retrying.
		for len(b.emu.Requests()) < 2 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()

	start := time.Now()
	_, err := b.client.CreatePaymentIntent(ctx, createReq(t, "pm_card_visa"))

	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, payments.ErrUnavailable)
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestHonorsContextDeadlineDuringAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, payments.Config{Timeout: 5 * time.Second, MaxElapsed: 30 * time.Second})
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, After: 700 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	defer cancel()

	_, err := b.client.CreatePaymentIntent(ctx, createReq(t, "pm_card_visa"))

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
	require.Equal(t, 0, calls(t, reg, "create", "succeeded"))
}

// TestCheckAPIBase: STRIPE_API_BASE must be an absolute http or https URL
// with a host.
func TestCheckAPIBase(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{payments.DefaultAPIBase, "http://127.0.0.1:12111", "http://stripe-emulator:12111/",
		"https://proxy.internal/stripe"} {
		require.NoError(t, payments.CheckAPIBase(ok), ok)
	}
	for _, bad := range []string{"", "notaurl", "ftp://x", "api.stripe.com", "https://", "http://:12111",
		"//api.stripe.com", "https://api.stripe.com?x=1", "https://api.stripe.com/#frag", "http://[::1"} {
		require.Error(t, payments.CheckAPIBase(bad), bad)
	}
}
