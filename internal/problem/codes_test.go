package problem

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// notInContract are the codes the service answers with that
// docs/CONTRACT.md does not name, each with why it exists.
var notInContract = map[Code]string{
	CodeInternal:         "the generic 500 every unexpected error becomes",
	CodeMethodNotAllowed: "a known route with another method (the router)",
	CodeHeadersTooLarge:  "request headers over HTTP_MAX_HEADER_BYTES (the server)",
	CodeMalformedEvent:   "a signed webhook body that is not a Stripe event",
}

// stripeCodes are codes the contract names that are Stripe's answers, not
// the service's.
var stripeCodes = map[string]bool{"idempotency_error": true}

// contractCodes reads docs/CONTRACT.md and returns every code it names
// ("code `x`", "codes `x`, `y`", "`409 x`") with the statuses it gives each
// (none when the sentence gives several, as in "`502`/`503` (codes …)").
func contractCodes(t *testing.T) map[string][]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "CONTRACT.md"))
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(b)), " ") // code spans wrap lines
	codes := map[string][]int{}
	add := func(code, status string) {
		if stripeCodes[code] {
			return
		}
		if _, ok := codes[code]; !ok {
			codes[code] = nil
		}
		if status != "" {
			n, err := strconv.Atoi(status)
			require.NoError(t, err)
			codes[code] = append(codes[code], n)
		}
	}
	// "`409 idempotency_key_in_use`"
	for _, m := range regexp.MustCompile("`([45][0-9][0-9]) ([a-z_]+)`").FindAllStringSubmatch(text, -1) {
		add(m[2], m[1])
	}
	// "`401`, code `unauthorized`", "`400` code `idempotency_key_missing`"
	for _, m := range regexp.MustCompile("`([45][0-9][0-9])`,? codes? `([a-z_]+)`").FindAllStringSubmatch(text, -1) {
		add(m[2], m[1])
	}
	// "code `x`", "codes `x`, `y`": the code without a status.
	list := regexp.MustCompile("\\bcodes? ((?:`[a-z_]+`(?:, | or | and )?)+)")
	for _, m := range list.FindAllStringSubmatch(text, -1) {
		for _, c := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(m[1], -1) {
			add(c[1], "")
		}
	}
	// "(`400 idempotency_key_missing` / `idempotency_key_invalid`)"
	for _, m := range regexp.MustCompile("`[45][0-9][0-9] [a-z_]+` / `([a-z_]+)`").FindAllStringSubmatch(text, -1) {
		add(m[1], "")
	}
	return codes
}

// TestTable holds the table to the contract: every code the contract names
// has a row, with the status the contract gives it; every row is a code of
// the contract or a listed addition; every row has a title and a 4xx or 5xx
// status; the transient answers the contract sends with Retry-After have a
// default one.
func TestTable(t *testing.T) {
	t.Parallel()
	contract := contractCodes(t)
	require.GreaterOrEqual(t, len(contract), 20, "the contract's codes were not found: %v", contract)

	wire := map[string][]int{} // wire code -> statuses of its rows
	for code, spec := range table {
		require.NotEmpty(t, spec.Title, "%s has no title", code)
		require.True(t, spec.Status >= 400 && spec.Status <= 599, "%s: status %d", code, spec.Status)
		require.GreaterOrEqual(t, spec.RetryAfter, 0, "%s", code)
		w := spec.wire(code)
		if spec.As != "" {
			_, ok := table[spec.As]
			require.True(t, ok, "%s is answered as %s, which has no row", code, spec.As)
			require.Equal(t, table[spec.As].Title, spec.Title, "%s: one title per wire code", code)
		}
		wire[string(w)] = append(wire[string(w)], spec.Status)
		if _, ok := contract[string(w)]; !ok {
			_, listed := notInContract[w]
			require.True(t, listed, "%s is neither in docs/CONTRACT.md nor in notInContract", w)
		}
		// CONTRACT.md: in flight 409 with Retry-After: 1; 429, 502 and
		// 503 with Retry-After.
		switch {
		case code == CodeIdempotencyKeyInUse:
			require.Equal(t, 1, spec.RetryAfter, "%s", code)
		case spec.Status == 429 || spec.Status == 502 || spec.Status == 503:
			require.Positive(t, spec.RetryAfter, "%s has no default Retry-After", code)
		}
	}
	for code, statuses := range contract {
		got, ok := wire[code]
		require.True(t, ok, "docs/CONTRACT.md names %q, which the table lacks", code)
		for _, s := range statuses {
			require.Contains(t, got, s, "docs/CONTRACT.md answers %q with %d", code, s)
		}
	}
	for code := range notInContract {
		_, inContract := contract[string(code)]
		require.False(t, inContract, "%s is in the contract now: strike it from notInContract", code)
	}
}

// TestEveryCodeHasARow parses codes.go: every Code constant has a row, so a
// code added without its status fails here rather than as a 500.
func TestEveryCodeHasARow(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "codes.go", nil, 0)
	require.NoError(t, err)
	n := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				code, err := strconv.Unquote(v.(*ast.BasicLit).Value)
				require.NoError(t, err)
				_, ok := table[Code(code)]
				require.True(t, ok, "the constant for %q has no row in the table", code)
				n++
			}
		}
	}
	require.Equal(t, len(table), n, "every row is a Code constant of codes.go")
}

// TestEveryCodeIsInTheOpenAPISpec: api/openapi.yaml's Problem.code enum
// (which the public client's constants follow) names every code the table
// answers with, the wire names, so that a generated client knows them all.
func TestEveryCodeIsInTheOpenAPISpec(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "api", "openapi.yaml"))
	require.NoError(t, err)
	spec := strings.Join(strings.Fields(string(b)), " ")
	i := strings.Index(spec, "code: type: string enum: [")
	require.GreaterOrEqual(t, i, 0, "Problem.code's enum in api/openapi.yaml")
	list := spec[i+len("code: type: string enum: ["):]
	list = list[:strings.Index(list, "]")]
	enum := map[string]bool{}
	for _, c := range strings.Split(list, ",") {
		enum[strings.TrimSpace(c)] = true
	}
	for code, r := range table {
		require.True(t, enum[string(r.wire(code))], "api/openapi.yaml: Problem.code's enum lacks %q", r.wire(code))
	}
}
