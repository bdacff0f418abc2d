// Package grafana_test checks the dashboard: it must be a Grafana
// dashboard, and every series it queries must exist.
package grafana_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/deploy/promcheck"
)

// dashboard is what the test reads of a Grafana dashboard JSON model
// (https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/).
type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// TestDashboardQueriesExportedMetrics checks every query of every
// dashboard in this directory as the alerts' test checks alerts.yml: each
// metric and label value is one the code registers (or RabbitMQ's).
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	src := promcheck.GoSources(t, filepath.Join("..", ".."))
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		var d dashboard
		require.NoError(t, json.Unmarshal(data, &d), f)
		require.NotEmpty(t, d.UID, f)
		require.NotEmpty(t, d.Panels, f)
		for _, p := range d.Panels {
			require.Equal(t, "prometheus", p.Datasource.UID, "%s: %s: the provisioned Prometheus", f, p.Title)
			require.NotEmpty(t, p.Targets, "%s: %s", f, p.Title)
			for _, tg := range p.Targets {
				promcheck.CheckExpr(t, f+": "+p.Title, tg.Expr, src)
			}
		}
	}
}

// TestDashboardCoversTheAlertsMetrics holds the dashboard to issue 38's
// list: checkouts by outcome, replays, 409s, Stripe outcomes, outbox lag,
// dead letters, emails pending and failed, keys in flight.
func TestDashboardCoversTheAlertsMetrics(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("checkout.json")
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(data, &d))
	var exprs strings.Builder
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs.WriteString(tg.Expr + "\n")
		}
	}
	for _, metric := range []string{
		`checkout_idempotency_requests_total{route="POST /v1/checkouts"}`,
		`checkout_idempotency_requests_total{outcome="replayed"}`,
		`checkout_idempotency_requests_total{outcome="in_use"}`,
		"checkout_stripe_calls_total", "checkout_outbox_publish_lag_seconds_bucket",
		`rabbitmq_queue_messages{queue="notify.order_paid.dlq"}`,
		"checkout_notify_notifications_failed_total", "checkout_notify_emails_sent_total",
		"checkout_idempotency_unfinished_keys",
	} {
		require.True(t, strings.Contains(exprs.String(), metric), "no panel queries %s", metric)
	}
}
