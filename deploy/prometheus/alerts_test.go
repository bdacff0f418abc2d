// Package prometheus_test checks alerts.yml: it must load in Prometheus, and
// every series it uses must exist.
package prometheus_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
)

// external are the metric name prefixes that other software exports:
// RabbitMQ's rabbitmq_prometheus plugin and CloudNativePG's instances.
var external = []string{"rabbitmq_", "cnpg_"}

// TestAlertRules parses alerts.yml as Prometheus does (rulefmt, with the
// PromQL parser and template checks) and checks each alert's shape and that
// every metric and label value it selects is one this repository's code
// registers, or an allowed external one.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	groups, errs := rulefmt.ParseFile("alerts.yml", false, model.LegacyValidation, parser.NewParser(parser.Options{}), nil)
	require.Empty(t, errs, "alerts.yml does not load")
	require.NotEmpty(t, groups.Groups)

	src := goSources(t, filepath.Join("..", ".."))
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

			expr, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			require.NoError(t, err, name)
			selectors := 0
			parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
				vs, ok := node.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				selectors++
				require.NotEmpty(t, vs.Name, "%s: select metrics by name", name)
				if isExternal(vs.Name) {
					return nil
				}
				require.True(t, registered(src, vs.Name), "%s: no Go code registers the metric %q", name, vs.Name)
				for _, m := range vs.LabelMatchers {
					if m.Name == model.MetricNameLabel {
						continue
					}
					for _, v := range matcherValues(m) {
						require.Contains(t, src, `"`+v+`"`, "%s: %s{%s=%q}: no Go code uses the label value %q", name, vs.Name, m.Name, m.Value, v)
					}
				}
				return nil
			})
			require.Positive(t, selectors, "%s: selects no series", name)
		}
	}
}

func isExternal(metric string) bool {
	for _, p := range external {
		if strings.HasPrefix(metric, p) {
			return true
		}
	}
	return false
}

// registered reports whether metric, or the histogram or summary it is a
// series of, appears as a string literal in the sources.
func registered(src, metric string) bool {
	if strings.Contains(src, `"`+metric+`"`) {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(metric, suffix); ok && strings.Contains(src, `"`+base+`"`) {
			return true
		}
	}
	return false
}

var alternatives = regexp.MustCompile(`^[A-Za-z0-9_]+(\|[A-Za-z0-9_]+)*$`)

// matcherValues returns the label values m selects that the code must
// produce: the value of an equality matcher, the alternatives of a regexp
// that is a plain a|b|c list. Other matchers are not checked.
func matcherValues(m *labels.Matcher) []string {
	switch {
	case m.Type == labels.MatchEqual && m.Value != "":
		return []string{m.Value}
	case m.Type == labels.MatchRegexp && alternatives.MatchString(m.Value):
		return strings.Split(m.Value, "|")
	}
	return nil
}

// goSources concatenates the non-test Go files under root: where the
// service registers its metrics and sets their label values.
func goSources(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "vendor" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		b.Write(data)
		b.WriteByte('\n')
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, b.String(), "checkout_idempotency_requests_total", "the walk must reach internal/")
	return b.String()
}
