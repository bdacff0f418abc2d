package orders

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDesignDiagramIsTheTable: docs/DESIGN.md's Mermaid state diagram of
// the lifecycle draws exactly the moves of transitions, so the picture a
// reader trusts cannot drift from the one table the code obeys.
func TestDesignDiagramIsTheTable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "DESIGN.md"))
	require.NoError(t, err)
	doc := string(b)
	i := strings.Index(doc, "stateDiagram-v2")
	require.GreaterOrEqual(t, i, 0, "docs/DESIGN.md has the lifecycle diagram")
	block := doc[i : i+strings.Index(doc[i:], "```")]
	arrow := regexp.MustCompile(`(?m)^\s*([a-z_]+) --> ([a-z_]+)`)
	drawn := map[Status][]Status{}
	for _, m := range arrow.FindAllStringSubmatch(block, -1) {
		drawn[Status(m[1])] = append(drawn[Status(m[1])], Status(m[2]))
	}
	for _, from := range all {
		want := slices.Clone(transitions[from])
		got := drawn[from]
		slices.Sort(want)
		slices.Sort(got)
		require.Equal(t, want, got, "the diagram's arrows out of %s", from)
	}
	for from := range drawn {
		require.True(t, from.Valid(), "the diagram draws a status the code does not have: %s", from)
	}
}
