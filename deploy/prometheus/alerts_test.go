// Package prometheus_test checks alerts.yml: it must load in Prometheus, and
// every series it uses must exist.
package prometheus_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/deploy/promcheck"
)

// TestAlertRules parses alerts.yml as Prometheus does (rulefmt, with the
// PromQL parser and template checks) and checks each alert's shape and that
// every metric and label value it selects is one this repository's code
// registers, or an allowed external one (promcheck).
func TestAlertRules(t *testing.T) {
	t.Parallel()
	groups, errs := rulefmt.ParseFile("alerts.yml", false, model.LegacyValidation, parser.NewParser(parser.Options{}), nil)
	require.Empty(t, errs, "alerts.yml does not load")
	require.NotEmpty(t, groups.Groups)

	src := promcheck.GoSources(t, filepath.Join("..", ".."))
	seen := map[string]bool{}
	for _, g := range groups.Groups {
		require.NotEmpty(t, g.Rules, "group %s", g.Name)
		for _, r := range g.Rules {
			name := r.Alert
			require.NotEmpty(t, name, "group %s: only alerts belong here, not recording rules", g.Name)
			require.False(t, seen[name], "alert %s is defined twice", name)
			seen[name] = true
			require.Positive(t, time.Duration(r.For), "%s: a for: duration keeps one scrape from paging", name)
			require.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], "%s: severity label", name)
			require.NotEmpty(t, r.Annotations["summary"], "%s: summary", name)
			require.Contains(t, r.Annotations["description"], "Runbook:", "%s: the description says what to do", name)

			promcheck.CheckExpr(t, name, r.Expr, src)
		}
	}
}
