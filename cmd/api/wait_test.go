package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

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
			pr, pw := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, env(map[string]string{
					"HTTP_ADDR":        "127.0.0.1:0",
					"DATABASE_URL":     proxied.String(),
					"REDIS_URL":        testenv.RedisURL(),
					"REDIS_KEY_PREFIX": prefix,
				}), pw)
				pw.Close()
			}()
			msgs := make(chan struct{ Msg, Addr string }, 1024)
			go func() {
				defer close(msgs)
				sc := bufio.NewScanner(pr)
				for sc.Scan() {
					var line struct{ Msg, Addr string }
					if json.Unmarshal(sc.Bytes(), &line) == nil {
						select { // never blocks the api's log
						case msgs <- line:
						default:
						}
					}
				}
			}()
			waitFor := func(msg string) string {
				t.Helper()
				deadline := time.After(30 * time.Second)
				for {
					select {
					case line, ok := <-msgs:
						require.True(t, ok, "the api's log ended before %q", msg)
						if line.Msg == msg {
							return line.Addr
						}
					case err := <-done:
						t.Fatalf("run returned while PostgreSQL was away: %v", err)
					case <-deadline:
						t.Fatalf("no %q in the api's log", msg)
					}
				}
			}
			waitFor("postgres not reachable, retrying")

			if !tc.comes {
				stop() // SIGTERM while waiting
				require.NoError(t, <-done, "exit 0")
				return
			}
			require.NoError(t, proxy.Start())
			base := "http://" + waitFor("listening")
			resp, err := http.Get(base + "/readyz")
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			stop()
			require.NoError(t, <-done, "exit 0")
		})
	}
}
