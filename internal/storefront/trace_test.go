package storefront_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/onceonly/checkout/internal/storefront"
	"github.com/onceonly/checkout/internal/tracing"
)

// TestPayLinksToItsTrace: with a trace UI configured (TRACE_UI_URL) and
// tracing on, each attempt of a Pay links to the Pay's trace, and that trace is the one
// the API's checkout requests continue (their traceparent), so the link
// opens the click with the API's spans, and later the email's, under it.
// Not parallel: it installs the process's tracer provider.
func TestPayLinksToItsTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	t.Cleanup(tracing.Install(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
	api := &fakeAPI{}
	var mu sync.Mutex
	var traceparents []string
	recording := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/checkouts" {
			mu.Lock()
			traceparents = append(traceparents, r.Header.Get("traceparent"))
			mu.Unlock()
		}
		api.ServeHTTP(w, r)
	})
	shop := shopFor(t, recording, storefront.Config{TenantKey: "sk_test_acme",
		TraceUI: "http://localhost:16686/", Transport: tracing.HTTPTransport(http.DefaultTransport)})

	out := payAs(t, browserSession(t), shop.URL, purchaseBody("0b9c8d7e-6f5a-4b3c-9d2e-1f0a9b8c7d6e", "t@example.com"))
	require.Equal(t, storefront.OutcomePaid, out.Outcome, out.Message)
	require.Len(t, out.Attempts, 1)
	traceID, ok := strings.CutPrefix(out.Attempts[0].TraceURL, "http://localhost:16686/trace/")
	require.True(t, ok, "the Pay's attempt links to its trace: %q", out.Attempts[0].TraceURL)
	require.Len(t, traceID, 32)
	require.Len(t, traceparents, 1)
	require.Equal(t, traceID, strings.Split(traceparents[0], "-")[1], "the API continues the Pay's trace")
}
