package main

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/testenv"
)

// TestAPIWaitsForPostgresAtStart: an api started while PostgreSQL does not
// answer waits for it, as the dispatcher and the worker do, and serves once
// it answers; stopped while it waits, it exits 0. Before, it exited at once
// with "DATABASE_URL: ... connection refused", which reads like a bad value.
func TestAPIWaitsForPostgresAtStart(t *testing.T) {
	t.Parallel()
	_, dbURL := pgtest.NewDB(t)
	_, prefix := testenv.Redis(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)

	for _, tc := range []struct {
		name  string
		comes bool // PostgreSQL answers while the api waits
	}{{"database comes back", true}, {"stopped while waiting", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.New(io.Discard))
			proxy := toxiproxy.NewProxy(srv, "pg-api", "127.0.0.1:0", u.Host)
			require.NoError(t, srv.Collection.Add(proxy, true))
			t.Cleanup(func() { _ = srv.Collection.Clear() })
			proxy.Lock()
			proxied := *u
			proxied.Host = proxy.Listen
			proxy.Unlock()
			proxy.Stop() // refuses connections on that port until Start

			ctx, stop := context.WithCancel(context.Background())
			t.Cleanup(stop)
			lines, done := runAPI(ctx, map[string]string{
				"HTTP_ADDR":        "127.0.0.1:0",
				"DATABASE_URL":     proxied.String(),
				"REDIS_URL":        testenv.RedisURL(),
				"REDIS_KEY_PREFIX": prefix,
			})
			waitForLog(t, lines, done, "postgres not reachable, retrying")

			if !tc.comes {
				stop() // SIGTERM while waiting
				require.NoError(t, <-done, "exit 0")
				return
			}
			require.NoError(t, proxy.Start())
			base := "http://" + waitForLog(t, lines, done, "listening")
			resp, err := http.Get(base + "/readyz")
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			stop()
			require.NoError(t, <-done, "exit 0")
		})
	}
}
