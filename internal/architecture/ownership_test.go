package architecture

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// owners is the one package that reads and writes each table
// (docs/DESIGN.md, "v3: one owner per table"). Every other package goes
// through the owner's Go API.
var owners = map[string]string{
	"idempotency_keys": "internal/idempotency",
	"orders":           "internal/orders",
	"order_items":      "internal/orders",
	"products":         "internal/checkout",
	"stock_buckets":    "internal/checkout",
	"payment_attempts": "internal/stripestep",
	"refunds":          "internal/refunds",
	"outbox":           "internal/outbox",
	"outbox_sequences": "internal/outbox",
	"inbox":            "internal/inbox",
	"inbox_parked":     "internal/inbox",
	"inbox_sequences":  "internal/inbox",
	"notifications":    "internal/notify",
	"dead_letters":     "internal/deadletter",
}

// debts are the places that still name another package's table, as
// "table package" pairs, each with its reason. Issue 20's redesign paid the
// last of them. The test fails on a pair not listed here (a new debt) and
// on a listed pair that no longer occurs (a debt paid: strike it here, so
// the list stays the truth).
var debts = map[string]bool{}

// sqlTable finds the table a statement names after FROM, INTO, UPDATE,
// JOIN or TABLE (quoted or not).
var sqlTable = regexp.MustCompile(`(?i)\b(?:FROM|INTO|UPDATE|JOIN|TABLE)\s+"?([a-z_]+)"?`)

// sqlListedTable finds a table named later in a FROM list, after a comma
// and with an alias (") d, orders o WHERE"), which sqlTable does not see.
var sqlListedTable = regexp.MustCompile(`(?i),\s*"?([a-z_]+)"?\s+(?:AS\s+)?[a-z][a-z0-9_]*\s+(?:WHERE|JOIN|LEFT|INNER|CROSS|ON)\b`)

// TestOneOwnerPerTable reads every non-test Go file of the service (cmd/
// and internal/, not the test harnesses) and finds each table it names: in
// a string literal holding SQL, in a GORM TableName method, or in
// db.Table("..."). A table named outside its owner is a violation unless
// it is a listed debt.
func TestOneOwnerPerTable(t *testing.T) {
	found := map[string][]string{} // "table package" -> positions
	// The test harnesses seed and inspect every table on purpose.
	serviceFiles(t, []string{"internal/testenv", "internal/architecture"}, func(path, rel string) {
		for _, use := range tablesNamedIn(t, path) {
			pkg := filepath.ToSlash(filepath.Dir(rel))
			if strings.HasPrefix(pkg, "cmd/") {
				pkg = "cmd" // a main names tables only to wire or demo; all of cmd is one place
			}
			owner, ok := owners[use.table]
			if !ok || pkg == owner {
				continue
			}
			k := use.table + " " + pkg
			found[k] = append(found[k], rel+":"+strconv.Itoa(use.line))
		}
	})
	var keys []string
	for k := range found {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !debts[k] {
			table, pkg, _ := strings.Cut(k, " ")
			t.Errorf("%s names table %s, which %s owns: call the owner's Go API instead (at %s)",
				pkg, table, owners[table], strings.Join(found[k], ", "))
		}
	}
	for k := range debts {
		if found[k] == nil {
			t.Errorf("debt %q is paid: strike it from debts", k)
		}
	}
}

type tableUse struct {
	table string
	line  int
}

func tablesNamedIn(t *testing.T, path string) []tableUse {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var uses []tableUse
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if n.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(n.Value)
			if err != nil {
				return true
			}
			line := fset.Position(n.Pos()).Line
			if _, ok := owners[s]; ok && gormTableName(f, n) {
				uses = append(uses, tableUse{s, line})
				return true
			}
			for _, re := range []*regexp.Regexp{sqlTable, sqlListedTable} {
				for _, m := range re.FindAllStringSubmatch(s, -1) {
					if _, ok := owners[m[1]]; ok {
						uses = append(uses, tableUse{m[1], line})
					}
				}
			}
		}
		return true
	})
	return uses
}

// gormTableName reports whether lit is a table's name given to GORM: the
// result of a TableName method or the argument of .Table(...).
func gormTableName(f *ast.File, lit *ast.BasicLit) bool {
	yes := false
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if n.Name.Name == "TableName" && n.Body != nil && contains(n.Body, lit) {
				yes = true
			}
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Table" {
				for _, a := range n.Args {
					if a == lit {
						yes = true
					}
				}
			}
		}
		return !yes
	})
	return yes
}

func contains(root ast.Node, target ast.Node) bool {
	in := false
	ast.Inspect(root, func(n ast.Node) bool {
		if n == target {
			in = true
		}
		return !in
	})
	return in
}

// serviceFiles calls fn with the path and the repository-relative path of
// every non-test Go file under cmd/ and internal/, leaving out the
// directories in skip (repository-relative, slash-separated).
func serviceFiles(t *testing.T, skip []string, fn func(path, rel string)) {
	t.Helper()
	root := filepath.Join("..", "..")
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			if d.IsDir() {
				if slices.Contains(skip, filepath.ToSlash(rel)) {
					return filepath.SkipDir
				}
				return nil
			}
			if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				fn(path, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
