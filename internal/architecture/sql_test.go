package architecture

import (
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"strconv"
	"testing"
)

// sqlText matches a string that holds SQL: a statement's opening words or
// a clause of one.
var sqlText = regexp.MustCompile(`(?is)\b(SELECT\s.+\sFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|WHERE\s|EXISTS\s*\()`)

// TestNoSQLCrossesAPackage: no package hands SQL to another. An exported
// function or method of the service returns no SQL text (a statement with
// its arguments, or a condition to splice in), and no exported constant
// or variable holds any: a table's owner runs its statements itself, in
// the caller's transaction (*gorm.DB) or batch (postgres.Batch), so the
// ownership test's "SQL naming a table appears only in its owner" cannot
// be got round by building the SQL in the owner and running it elsewhere.
// internal/postgres is the exception: it is where statements are run.
func TestNoSQLCrossesAPackage(t *testing.T) {
	var found []string
	// internal/postgres with its subpackages (the test helpers among them).
	skip := []string{"internal/testenv", "internal/architecture", "internal/postgres"}
	serviceFiles(t, skip, func(path, rel string) { found = append(found, sqlHandedOut(t, path, rel)...) })
	for _, f := range found {
		t.Errorf("%s hands SQL to other packages: run the statement in the owner (taking a *gorm.DB or a *postgres.Batch) instead", f)
	}
}

// sqlHandedOut lists the exported identifiers of the file at path that
// hand out SQL: functions whose results are a string and its arguments
// ([]any), or that return a literal holding SQL, and constants and
// variables whose value holds SQL.
func sqlHandedOut(t *testing.T, path, rel string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	at := func(n ast.Node, name string) string {
		return rel + ":" + strconv.Itoa(fset.Position(n.Pos()).Line) + " " + name
	}
	var out []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Body == nil || d.Type.Results == nil {
				continue
			}
			if returnsStatement(d.Type.Results) {
				out = append(out, at(d, d.Name.Name+" returns a statement and its arguments"))
				continue
			}
			ast.Inspect(d.Body, func(n ast.Node) bool {
				if _, ok := n.(*ast.FuncLit); ok {
					return false // a closure's returns are not d's
				}
				if r, ok := n.(*ast.ReturnStmt); ok {
					for _, res := range r.Results {
						if holdsSQL(res) {
							out = append(out, at(r, d.Name.Name+" returns SQL"))
						}
					}
				}
				return true
			})
		case *ast.GenDecl:
			if d.Tok != token.CONST && d.Tok != token.VAR {
				continue
			}
			for _, spec := range d.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if name.IsExported() && i < len(vs.Values) && holdsSQL(vs.Values[i]) {
						out = append(out, at(name, name.Name+" holds SQL"))
					}
				}
			}
		}
	}
	return out
}

// returnsStatement reports whether results are a string followed by an
// []any: the shape of "a statement and its arguments".
func returnsStatement(results *ast.FieldList) bool {
	var types []string
	for _, r := range results.List {
		n := len(r.Names)
		if n == 0 {
			n = 1
		}
		for range n {
			types = append(types, exprString(r.Type))
		}
	}
	for i := 0; i+1 < len(types); i++ {
		if types[i] == "string" && (types[i+1] == "[]any" || types[i+1] == "[]interface{}") {
			return true
		}
	}
	return false
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.ArrayType:
		return "[]" + exprString(e.Elt)
	case *ast.InterfaceType:
		return "interface{}"
	}
	return ""
}

// holdsSQL reports whether e is, or concatenates, a string literal that
// holds SQL.
func holdsSQL(e ast.Expr) bool {
	yes := false
	ast.Inspect(e, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil && sqlText.MatchString(s) {
				yes = true
			}
		}
		return !yes
	})
	return yes
}
