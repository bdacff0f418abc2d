package daemon_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/daemon"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/telemetry"
	"github.com/onceonly/checkout/internal/testenv"
)

// TestStartServesReadinessWhileWaiting: before Postgres answers, /readyz
// is served and says 503 naming postgres; a stop while waiting returns
// (nil, nil), and the ops server is gone afterwards.
func TestStartServesReadinessWhileWaiting(t *testing.T) {
	t.Parallel()
	dead := strconv.Itoa(testenv.FreePort(t)) // nothing listens there
	ops := testenv.FreeAddr(t)
	s := &config.Shared{DatabaseURL: "postgres://postgres@127.0.0.1:" + dead + "/x?connect_timeout=1"}
	broker := &rabbitmq.Settings{AMQPURL: "amqp://guest:guest@127.0.0.1:" + dead + "/", Exchange: "e", NotifyQueue: "q"}
	ctx, cancel := context.WithCancel(t.Context())
	type result struct {
		p   *daemon.Process
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := daemon.Start(ctx, "test", s, broker, ops, telemetry.NewLogger(io.Discard, 0), "outbox")
		done <- result{p, err}
	}()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + ops + "/readyz")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable && string(body) != "" &&
			strings.Contains(string(body), "postgres")
	}, 10*time.Second, 50*time.Millisecond)
	cancel()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.Nil(t, r.p)
	case <-time.After(15 * time.Second):
		t.Fatal("Start did not return after its context ended")
	}
	_, err := http.Get("http://" + ops + "/readyz")
	require.Error(t, err, "the ops server must be shut down when Start gives up")
}

// TestStartNamesABadMetricsAddr: an address that cannot be listened on is
// an error naming METRICS_ADDR, before anything is dialed.
func TestStartNamesABadMetricsAddr(t *testing.T) {
	t.Parallel()
	_, err := daemon.Start(t.Context(), "test", &config.Shared{}, &rabbitmq.Settings{}, "127.0.0.1:99999", telemetry.NewLogger(io.Discard, 0))
	require.ErrorContains(t, err, "METRICS_ADDR")
}
