package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDatabaseFollowsTheStack: without DATABASE_URL the outbox is read
// from the database of the stack the sink belongs to: make run's on 5432,
// compose's on CHECKOUT_POSTGRES_PORT (15432 by default), because compose
// keeps its Postgres off 5432 (docker-compose.yml).
func TestDatabaseFollowsTheStack(t *testing.T) {
	t.Parallel()
	mailpitSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/info":
			_, _ = io.WriteString(w, `{"Version":"v1.27.11"}`)
		case "/api/v1/search":
			require.Equal(t, "ord_1", r.URL.Query().Get("query"))
			_, _ = io.WriteString(w, `{"messages":[{"MessageID":"notification-ntf_1@checkout.local","Subject":"Your order ord_1 is paid"}],"messages_count":1}`)
		default: // Mailpit's web UI answers any other path with its page
			_, _ = io.WriteString(w, `<!DOCTYPE html>`)
		}
	}))
	t.Cleanup(mailpitSrv.Close)
	sinkSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/messages" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, `[{"message_id":"<notification-ntf_2@checkout.local>","subject":"Your order ord_2 is paid"},{"message_id":"<x>","subject":"Your order ord_3 is paid"}]`)
	}))
	t.Cleanup(sinkSrv.Close)
	ctx := context.Background()

	for _, tc := range []struct {
		name, sink string
		env        map[string]string
		wantDB     string
		order      string
		wantEmail  email
	}{
		{"docker compose", mailpitSrv.URL, nil, "postgres://postgres@127.0.0.1:15432/checkout?sslmode=disable",
			"ord_1", email{"<notification-ntf_1@checkout.local>", "Your order ord_1 is paid"}},
		{"docker compose with its port moved", mailpitSrv.URL, map[string]string{"CHECKOUT_POSTGRES_PORT": "25433"},
			"postgres://postgres@127.0.0.1:25433/checkout?sslmode=disable",
			"ord_1", email{"<notification-ntf_1@checkout.local>", "Your order ord_1 is paid"}},
		{"make run", sinkSrv.URL, nil, "postgres://postgres@127.0.0.1:5432/checkout?sslmode=disable",
			"ord_2", email{"<notification-ntf_2@checkout.local>", "Your order ord_2 is paid"}},
		{"DATABASE_URL wins", sinkSrv.URL, map[string]string{"DATABASE_URL": "postgres://postgres@db:5432/mine"},
			"postgres://postgres@db:5432/mine", "ord_2", email{"<notification-ntf_2@checkout.local>", "Your order ord_2 is paid"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"SINK": tc.sink}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg := loadConfig(func(k string) string { return env[k] })
			s, err := detectSink(ctx, cfg.Sink)
			require.NoError(t, err)
			db, _ := cfg.databaseURL(s)
			require.Equal(t, tc.wantDB, db)
			ms, err := s.Emails(ctx, tc.order)
			require.NoError(t, err)
			require.Equal(t, []email{tc.wantEmail}, ms)
		})
	}

	_, err := detectSink(ctx, "http://127.0.0.1:1")
	require.ErrorContains(t, err, "Set SINK")
}

// TestComposeEnvGivesThePorts (issue 34): with CHECKOUT_POSTGRES_PORT in the
// .env beside docker-compose.yml, as README suggests, the demo reads the
// outbox from the port compose published, from the repository's root or a
// folder below it; the environment wins, as it does for compose; and the
// file's other variables are not the demo's.
func TestComposeEnvGivesThePorts(t *testing.T) {
	t.Parallel()
	repo := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(repo, "docker-compose.yml"), []byte("name: checkout\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(repo, ".env"),
		[]byte("# moved off a port in use\nCHECKOUT_POSTGRES_PORT=\"25433\"\nAPI=http://127.0.0.1:1\n"), 0o644))
	below := filepath.Join(repo, "cmd", "demo")
	require.NoError(t, os.MkdirAll(below, 0o755))
	compose := mailpit{"http://127.0.0.1:8025"}

	for _, tc := range []struct {
		name, dir string
		env       map[string]string
		wantDB    string
	}{
		{"from .env", repo, nil, "postgres://postgres@127.0.0.1:25433/checkout?sslmode=disable"},
		{"from .env, below the root", below, nil, "postgres://postgres@127.0.0.1:25433/checkout?sslmode=disable"},
		{"the environment wins", repo, map[string]string{"CHECKOUT_POSTGRES_PORT": "35433"},
			"postgres://postgres@127.0.0.1:35433/checkout?sslmode=disable"},
		{"no compose file above", t.TempDir(), nil, "postgres://postgres@127.0.0.1:15432/checkout?sslmode=disable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv, err := withComposeEnv(func(k string) string { return tc.env[k] }, tc.dir)
			require.NoError(t, err)
			cfg := loadConfig(getenv)
			db, _ := cfg.databaseURL(compose)
			require.Equal(t, tc.wantDB, db)
			require.Equal(t, "http://127.0.0.1:8080", cfg.API, "API is not compose's: the .env's is not read")
		})
	}

	bad := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bad, "docker-compose.yml"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(bad, ".env"), []byte("CHECKOUT_POSTGRES_PORT=\"25433\n"), 0o644))
	_, err := withComposeEnv(func(string) string { return "" }, bad)
	require.ErrorContains(t, err, ".env")
}

// TestNoEscapeCodesOffTerminal (issue 36): `make demo > demo.log`, or into a
// pipe, writes the step titles without the terminal's bold codes.
func TestNoEscapeCodesOffTerminal(t *testing.T) {
	t.Parallel()
	mailpitSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"Version":"v1.27.11"}`)
	}))
	t.Cleanup(mailpitSrv.Close)
	file, err := os.Create(filepath.Join(t.TempDir(), "demo.log"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = file.Close() })
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(); _ = w.Close() })

	for name, out := range map[string]io.Writer{"a file": file, "a pipe": w} {
		require.False(t, isTerminal(out), name)
		cfg := loadConfig(func(k string) string { return map[string]string{"SINK": mailpitSrv.URL}[k] })
		d, err := newDemo(context.Background(), cfg, out)
		require.NoError(t, err)
		d.step("a checkout")
	}
	require.NoError(t, w.Close())
	piped, err := io.ReadAll(r)
	require.NoError(t, err)
	written, err := os.ReadFile(file.Name())
	require.NoError(t, err)
	for name, b := range map[string][]byte{"a file": written, "a pipe": piped} {
		require.Contains(t, string(b), "== 1. a checkout\n", name)
		require.NotContains(t, string(b), "\033", name)
	}
}
