package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76/webhook"

	"go.uber.org/goleak"

	"github.com/onceonly/checkout/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start runs the emulator on a free port and returns its base URL and a stop
// function that cancels run's context and returns run's result. The test's
// cleanup calls stop too; only the first call waits.
func start(t testing.TB, extra ...string) (base string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &testenv.Output{}
	env := map[string]string{"STRIPE_EMULATOR_ADDR": "127.0.0.1:0"}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(k string) string { return env[k] }, out) }()
	stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { _ = stop() })
	return "http://" + testenv.LogValue(t, out, "stripe emulator listening", "addr"), stop
}

func TestRunServesAndDrains(t *testing.T) {
	t.Parallel()
	base, stop := start(t)

	res, err := http.Get(base + "/healthz")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	// A charge in flight when shutdown starts still completes.
	fault, err := http.Post(base+"/_emulator/faults", "application/json",
		strings.NewReader(`{"kind":"delay","count":1,"before":"300ms"}`))
	require.NoError(t, err)
	fault.Body.Close()
	require.Equal(t, http.StatusNoContent, fault.StatusCode)

	type result struct {
		status int
		err    error
	}
	charged := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/payment_intents",
			strings.NewReader("amount=100&currency=usd&payment_method=pm_card_visa&confirm=true"))
		req.Header.Set("Authorization", "Bearer sk_test_123")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", "k")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			charged <- result{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		charged <- result{status: res.StatusCode}
	}()
	require.Eventually(t, func() bool {
		res, err := http.Get(base + "/_emulator/stats")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		var s struct {
			InFlight int `json:"in_flight"`
		}
		return json.NewDecoder(res.Body).Decode(&s) == nil && s.InFlight == 1
	}, 5*time.Second, 10*time.Millisecond)

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	r := <-charged
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.status, "the request in flight finished during shutdown")
	require.NoError(t, <-stopped)
	http.DefaultClient.CloseIdleConnections()
}

func TestRunFailsOnBadAddress(t *testing.T) {
	t.Parallel()
	env := map[string]string{"STRIPE_EMULATOR_ADDR": "not-an-address"}
	err := run(t.Context(), func(k string) string { return env[k] }, io.Discard)
	require.ErrorContains(t, err, "STRIPE_EMULATOR_ADDR")
}

func TestRunRejectsBadDurations(t *testing.T) {
	t.Parallel()
	for name, val := range map[string]string{
		"STRIPE_EMULATOR_KEY_TTL":     "0s",
		"STRIPE_EMULATOR_SEARCH_LAG":  "soon",
		"STRIPE_EMULATOR_WEBHOOK_URL": "localhost:8080/v1/webhooks/stripe",
		"STRIPE_EMULATOR_PUBLIC_URL":  "localhost:12111",
	} {
		env := map[string]string{"STRIPE_EMULATOR_ADDR": "127.0.0.1:0", name: val}
		err := run(t.Context(), func(k string) string { return env[k] }, io.Discard)
		require.ErrorContains(t, err, name)
	}
}

func TestRunDeliversSignedWebhooks(t *testing.T) {
	t.Parallel()
	type hit struct {
		body []byte
		sig  string
	}
	hits := make(chan hit, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		hits <- hit{body, r.Header.Get("Stripe-Signature")}
	}))
	defer receiver.Close()
	base, stop := start(t, "STRIPE_EMULATOR_WEBHOOK_URL", receiver.URL, "STRIPE_WEBHOOK_SECRET", "whsec_cmd")

	req, _ := http.NewRequest(http.MethodPost, base+"/v1/payment_intents", strings.NewReader("amount=100&currency=usd"))
	req.Header.Set("Authorization", "Bearer sk_test_123")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	select {
	case h := <-hits:
		ev, err := webhook.ConstructEvent(h.body, h.sig, "whsec_cmd")
		require.NoError(t, err)
		require.Equal(t, "payment_intent.created", string(ev.Type))
	case <-time.After(10 * time.Second):
		t.Fatal("no webhook within 10s")
	}
	require.NoError(t, stop())
	http.DefaultClient.CloseIdleConnections()
}
