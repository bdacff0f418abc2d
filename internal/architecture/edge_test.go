package architecture

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// edgeImports are the packages of the HTTP edge: the router, the API's
// assembly, request decoding and the middlewares. Only internal/api (and
// the processes in cmd/) put them together with the domain.
var edgeImports = []string{
	"github.com/gin-gonic/",
	"net/http/httptest",
	"github.com/onceonly/checkout/internal/api",
	"github.com/onceonly/checkout/internal/httpbody",
	"github.com/onceonly/checkout/internal/auth",
	"github.com/onceonly/checkout/internal/ratelimit",
}

// domains are the domain packages held to "HTTP at the edge" (docs/DESIGN.md,
// "v4"), each with the other domain packages it must not import either:
// checkout's GET order view, which joins refunds and notifications, is
// internal/api's.
var domains = map[string][]string{
	"internal/checkout": {
		"github.com/onceonly/checkout/internal/notify",
		"github.com/onceonly/checkout/internal/refunds",
	},
	"internal/refunds": nil,
}

// rendering are package problem's names that turn a coded error into a
// response; the edge (internal/api, and the idempotency layer for the
// responses it stores) uses them, a domain package never.
var rendering = []string{"Write", "From", "Internal", "Problem", "ContentType"}

// TestHTTPAtTheEdge holds the domain packages (domains) to commands,
// queries and coded errors: no non-test file imports a package of the HTTP
// edge (edgeImports) or a listed domain package, and of net/http it names
// only status constants (http.StatusCreated for a stored outcome), never a
// handler, a request or a response writer; nor does it render a coded
// error (rendering).
func TestHTTPAtTheEdge(t *testing.T) {
	root := filepath.Join("..", "..")
	for dir, banned := range domains {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		files := 0
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			files++
			rel := dir + "/" + name
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, filepath.Join(root, dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				for _, b := range slices.Concat(edgeImports, banned) {
					if path == b || strings.HasPrefix(path, b) && strings.HasSuffix(b, "/") {
						t.Errorf("%s imports %s: HTTP and views that join other domains live in internal/api", rel, path)
					}
				}
			}
			httpName, problemName := importName(f, "net/http"), importName(f, problemImport)
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				id, ok := sel.X.(*ast.Ident)
				switch {
				case !ok:
				case httpName != "" && id.Name == httpName && !strings.HasPrefix(sel.Sel.Name, "Status"):
					t.Errorf("%s:%d: http.%s: a domain package names no handler, request or writer; internal/api serves it",
						rel, fset.Position(sel.Pos()).Line, sel.Sel.Name)
				case problemName != "" && id.Name == problemName && slices.Contains(rendering, sel.Sel.Name):
					t.Errorf("%s:%d: problem.%s: a domain package returns coded errors; the edge renders them",
						rel, fset.Position(sel.Pos()).Line, sel.Sel.Name)
				}
				return true
			})
		}
		if files == 0 {
			t.Errorf("%s: no Go files; update domains", dir)
		}
	}
}

// TestCodeToStatusOnce: internal/problem's table is the one place where an
// error code becomes an HTTP status. No declaration outside internal/problem
// names both a problem code (problem.CodeX, or a conversion problem.Code(x))
// and an HTTP status (http.StatusX, or an integer 100..599 in a case clause,
// a map literal's key or value), the shape a second mapping would take: a
// switch over codes or a map from codes to statuses. TestOneErrorModel
// already keeps statuses out of package problem's calls.
func TestCodeToStatusOnce(t *testing.T) {
	serviceFiles(t, []string{"internal/problem"}, func(path, rel string) {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		problemName := importName(f, problemImport)
		if problemName == "" {
			return
		}
		httpName := importName(f, "net/http")
		for _, d := range f.Decls {
			var codes, statuses []string
			ast.Inspect(d, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					id, ok := n.X.(*ast.Ident)
					switch {
					case !ok:
					case id.Name == problemName && strings.HasPrefix(n.Sel.Name, "Code"):
						codes = append(codes, "problem."+n.Sel.Name)
					case httpName != "" && id.Name == httpName && strings.HasPrefix(n.Sel.Name, "Status"):
						statuses = append(statuses, "http."+n.Sel.Name)
					}
				case *ast.CaseClause:
					for _, e := range n.List {
						if s := httpStatus(e, ""); s != "" {
							statuses = append(statuses, s)
						}
					}
				case *ast.KeyValueExpr:
					for _, e := range []ast.Expr{n.Key, n.Value} {
						if s := httpStatus(e, ""); s != "" {
							statuses = append(statuses, s)
						}
					}
				}
				return true
			})
			if len(codes) > 0 && len(statuses) > 0 {
				sort.Strings(codes)
				t.Errorf("%s:%d: names %s and %s: a code gets its status in internal/problem's table only",
					filepath.ToSlash(rel), fset.Position(d.Pos()).Line, strings.Join(codes, ", "), strings.Join(statuses, ", "))
			}
		}
	})
}
