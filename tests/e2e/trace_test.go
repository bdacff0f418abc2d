package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/tests/e2e/stack"
)

// One checkout is one trace across the three processes (issue 38): the
// api, the dispatcher and the worker export to an OTLP receiver in the
// test; the dispatcher is killed before the POST and started again after
// its answer, so the trace context crosses the restart only through the
// outbox row. The spans of the trace the client started run from the
// POST's server span to the worker's SMTP send, which descends from the
// dispatcher's publish through the AMQP headers.
//
// When the trace is incomplete it prints every span the receiver got, so
// that a lost span shows where it went (issue 38's: an order.paid that
// overtook its order.created was parked, and its email, applied later,
// started a trace of its own until parked events kept their traceparent).
func TestOneTraceFromPostToSMTPSend(t *testing.T) {
	t.Parallel()
	otlp := stack.NewOTLPReceiver(t)
	// A short batch delay (ms), so that the spans arrive while the test
	// waits rather than five seconds later.
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.URL, "OTEL_BSP_SCHEDULE_DELAY": "100"}
	s := setup(t, stack.Options{Env: map[string]map[string]string{"api": env, "dispatcher": env, "worker": env}})
	ctx := testCtx(t, 90*time.Second)

	s.Dispatcher.Kill()
	const traceID, clientSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	c := s.Client()
	c.Header = http.Header{"Traceparent": {"00-" + traceID + "-" + clientSpan + "-01"}}
	o := paidOrder(t, last(untilFinal(ctx, t, c, "k-trace", stack.TeeBody("trace@example.com", 1))))
	require.NoError(t, s.Dispatcher.Start())
	eventually(t, 30*time.Second, func() bool { return s.Emails(o.ID) == 1 }, "the order's email is sent")

	var spans []stack.Span
	has := func(name string) bool {
		return slices.ContainsFunc(spans, func(sp stack.Span) bool { return sp.Name == name })
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		spans = otlp.Trace(traceID)
		// Each process exports on its own schedule: the worker's send can
		// arrive before the dispatcher's publish, its parent.
		if has("smtp send") && has("POST /v1/checkouts") && has("checkout.events publish") {
			break
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, sp := range otlp.Spans() {
				if sp.Service != "checkout-api" || sp.TraceID == traceID {
					fmt.Fprintf(&b, "%s %s trace=%s span=%s parent=%s %s..%s\n", sp.Service, sp.Name, sp.TraceID, sp.SpanID, sp.ParentSpanID, sp.Start.Format("15:04:05.000"), sp.End.Format("15:04:05.000"))
				}
			}
			t.Fatalf("after 30s the trace has not reached the receiver from the POST through the publish to the SMTP send; spans:\n%s\ndispatcher log:\n%s", b.String(), s.Dispatcher.LogTail(40))
		}
		time.Sleep(20 * time.Millisecond)
	}

	services := map[string]bool{}
	byID := map[string]stack.Span{}
	for _, sp := range spans {
		services[sp.Service] = true
		byID[sp.SpanID] = sp
	}
	require.Equal(t, map[string]bool{"checkout-api": true, "checkout-dispatcher": true, "checkout-worker": true}, services)

	var send stack.Span
	for _, sp := range spans {
		if sp.Name == "smtp send" {
			send = sp
		}
	}
	var chain []string
	for sp, ok := send, true; ok; sp, ok = byID[sp.ParentSpanID] {
		chain = append(chain, sp.Service+": "+sp.Name)
		if _, up := byID[sp.ParentSpanID]; !up {
			require.Equal(t, clientSpan, sp.ParentSpanID, "the chain ends at the client's span: %v", chain)
		}
	}
	require.Equal(t, []string{"checkout-worker: smtp send", "checkout-worker: notify.order_paid process",
		"checkout-dispatcher: checkout.events publish"}, chain[:3])
	require.Contains(t, chain, "checkout-api: POST /v1/checkouts")

	// The docs' picture of this trace (docs/tracing.md): with
	// UPDATE_SCREENSHOTS=1 written to docs/tracing/, otherwise to a
	// temporary directory, so that every run renders it.
	dir := t.TempDir()
	if os.Getenv("UPDATE_SCREENSHOTS") == "1" {
		dir = filepath.Join("..", "..", "docs", "tracing")
		require.NoError(t, os.MkdirAll(dir, 0o755))
	}
	// The email's span is exported once sent; take the trace as it is now.
	page := stack.Waterfall("One checkout, one trace: POST /v1/checkouts to the SMTP send", otlp.Trace(traceID))
	shot := screenshot(t, page)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "checkout-trace.png"), shot, 0o644))
}

// screenshot renders page in headless Chromium (Debian's, or $CHROMIUM:
// .ci/run installs it) and returns the whole page as a PNG.
func screenshot(t *testing.T, page string) []byte {
	t.Helper()
	chromium := os.Getenv("CHROMIUM")
	if chromium == "" {
		var err error
		chromium, err = exec.LookPath("chromium")
		require.NoError(t, err, "chromium renders the trace's picture (apt-get install chromium)")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, page)
	}))
	t.Cleanup(srv.Close)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.WindowSize(1240, 800))
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx), "start chromium %s", chromium)
	// Navigate returns once the page has loaded; it has no scripts.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL)))
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NotEmpty(t, png)
	return png
}
