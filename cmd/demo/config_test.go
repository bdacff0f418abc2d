package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
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
