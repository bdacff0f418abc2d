package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/stripeemu"
)

// TestOutcomeCounters: each idempotency outcome moves its counter by
// exactly one.
func TestOutcomeCounters(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.lease = 2 * time.Second })
	series := func(outcome string) float64 {
		return testutil.ToFloat64(h.registry.requests(outcome))
	}
	steps := []struct {
		outcome string
		do      func()
	}{
		{"new", func() { require.Equal(t, 201, h.checkout("m-1", teeBody).status) }},
		{"replayed", func() { require.Equal(t, 201, h.checkout("m-1", teeBody).status) }},
		{"reused", func() { require.Equal(t, 422, h.checkout("m-1", declinedBody).status) }},
		{"missing", func() { require.Equal(t, 400, h.checkout("", teeBody).status) }},
		{"invalid", func() { require.Equal(t, 400, h.checkout(strings.Repeat("x", 300), teeBody).status) }},
		{"failed", func() {
			require.Equal(t, 400, h.checkout("m-2", `{"email":"x"}`).status)
		}},
	}
	for _, st := range steps {
		before := map[string]float64{}
		for _, o := range []string{"new", "replayed", "reused", "missing", "invalid", "in_use", "failed"} {
			before[o] = series(o)
		}
		st.do()
		for o, v := range before {
			want := v
			if o == st.outcome {
				want++
			}
			require.Equal(t, want, series(o), "after a %q request, outcome %q", st.outcome, o)
		}
	}

	// in_use: a duplicate while the first is at Stripe.
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 700 * time.Millisecond}))
	done := make(chan int, 1)
	go func() { done <- h.checkout("m-3", teeBody).status }()
	require.Eventually(t, func() bool { return h.emu.InFlight() == 1 }, 5*time.Second, 10*time.Millisecond)
	inUse := series("in_use")
	require.Equal(t, http.StatusConflict, h.checkout("m-3", teeBody).status)
	require.Equal(t, inUse+1, series("in_use"))
	require.Equal(t, 201, <-done)

	metrics := h.scrape()
	for _, name := range []string{
		"checkout_idempotency_requests_total", "checkout_idempotency_duplicates_total",
		"checkout_http_request_duration_seconds", "go_goroutines",
	} {
		require.Contains(t, metrics, name)
	}
}

// TestLogsHoldNoSecrets: neither the raw idempotency key nor the API key is
// ever logged; the key appears only as a hash, with the tenant and request id.
func TestLogsHoldNoSecrets(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const key = "raw-key-that-must-not-be-logged"
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 500}))
	require.Equal(t, http.StatusBadGateway, h.checkout(key, teeBody).status) // logs a warning
	h.emu.ClearFaults()
	require.Equal(t, http.StatusCreated, h.checkout(key, teeBody).status)
	logs := h.logs.String()
	require.NotContains(t, logs, key)
	require.NotContains(t, logs, "sk_test_acme")
	require.Contains(t, logs, `"key_hash":"`)
	require.Contains(t, logs, `"tenant":"acme"`)
	require.Contains(t, logs, `"request_id":"`)
}
