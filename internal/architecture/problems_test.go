package architecture

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// problemImport is internal/problem's import path, under the module path
// go.mod declares (a fork made by gonew has another).
var problemImport = modulePath() + "/internal/problem"

// modulePath returns the module path of the go.mod at the module's root.
func modulePath() string {
	b, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		panic(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(path), `"`)
		}
	}
	panic("go.mod has no module line")
}

// TestOneErrorModel holds every non-test Go file outside internal/problem
// to the error model (internal/problem's doc): a package returns a coded
// problem.Error and never decides an HTTP status, title or Retry-After
// itself. So a file may not build a problem.Problem (a literal, or new),
// nor pass an HTTP status (http.StatusX or a number 100..599) to anything
// of package problem.
func TestOneErrorModel(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, dir := range []string{"cmd", "internal", "client"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				if rel == "internal/problem" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			for _, v := range problemsBuiltIn(t, path) {
				t.Errorf("%s:%d: %s: return a coded problem.Error; internal/problem's table gives the status", rel, v.line, v.what)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

type violation struct {
	line int
	what string
}

// problemsBuiltIn returns the places in the file at path that build a
// problem.Problem or hand package problem an HTTP status.
func problemsBuiltIn(t *testing.T, path string) []violation {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	problemName, httpName := importName(f, problemImport), importName(f, "net/http")
	if problemName == "" {
		return nil
	}
	isProblem := func(e ast.Expr) bool { // problem.Problem
		sel, ok := e.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Problem" {
			return false
		}
		id, ok := sel.X.(*ast.Ident)
		return ok && id.Name == problemName
	}
	var found []violation
	add := func(n ast.Node, what string) {
		found = append(found, violation{fset.Position(n.Pos()).Line, what})
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CompositeLit:
			if isProblem(n.Type) {
				add(n, "a problem.Problem literal")
			}
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "new" && len(n.Args) == 1 && isProblem(n.Args[0]) {
				add(n, "new(problem.Problem)")
			}
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); !ok || id.Name != problemName {
				return true
			}
			for _, a := range n.Args {
				if s := httpStatus(a, httpName); s != "" {
					add(a, "problem."+sel.Sel.Name+" given the status "+s)
				}
			}
		}
		return true
	})
	return found
}

// httpStatus returns the HTTP status e is (http.StatusX, or an integer
// literal 100..599), or "".
func httpStatus(e ast.Expr, httpName string) string {
	switch e := e.(type) {
	case *ast.SelectorExpr:
		if id, ok := e.X.(*ast.Ident); ok && httpName != "" && id.Name == httpName && strings.HasPrefix(e.Sel.Name, "Status") {
			return "http." + e.Sel.Name
		}
	case *ast.BasicLit:
		if n, err := strconv.Atoi(e.Value); e.Kind == token.INT && err == nil && n >= 100 && n <= 599 {
			return e.Value
		}
	}
	return ""
}

// importName returns the name a file gives the package at path, or "" when
// it does not import it.
func importName(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == path {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return path[strings.LastIndex(path, "/")+1:]
		}
	}
	return ""
}
