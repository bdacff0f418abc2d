// Package promcheck is what the tests of deploy/prometheus (alerts) and
// deploy/grafana (the dashboard) share: every metric and label value a
// PromQL expression of theirs selects must be one this repository's code
// registers, or one another program exports (External).
package promcheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
)

// External are the metric name prefixes that other software exports:
// RabbitMQ's rabbitmq_prometheus plugin and CloudNativePG's instances.
var External = []string{"rabbitmq_", "cnpg_"}

// CheckExpr parses expr (what is named by name, in the failure messages)
// and requires that it selects at least one series, every selector by
// metric name, and every metric and label value it selects registered in
// src (GoSources) unless External.
func CheckExpr(t testing.TB, name, expr, src string) {
	t.Helper()
	parsed, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	require.NoError(t, err, name)
	selectors := 0
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		selectors++
		require.NotEmpty(t, vs.Name, "%s: select metrics by name", name)
		if isExternal(vs.Name) {
			return nil
		}
		require.True(t, Registered(src, vs.Name), "%s: no Go code registers the metric %q", name, vs.Name)
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

func isExternal(metric string) bool {
	for _, p := range External {
		if strings.HasPrefix(metric, p) {
			return true
		}
	}
	return false
}

// Registered reports whether metric, or the histogram or summary it is a
// series of, appears as a string literal in the sources.
func Registered(src, metric string) bool {
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

// GoSources concatenates the non-test Go files under root (the
// repository): where the service registers its metrics and sets their
// label values.
func GoSources(t testing.TB, root string) string {
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
