package architecture

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// intentOwner is the one package that spells a Stripe PaymentIntent status
// (STYLE.md 12: a status is written in one place).
const intentOwner = "github.com/onceonly/checkout/internal/stripeintent"

// lifecycles are the typed statuses, each by the package that owns it and
// spells its values: the order's, the refund's and Stripe's PaymentIntent's.
var lifecycles = map[string]string{
	intentOwner: "Status",
	"github.com/onceonly/checkout/internal/orders":  "Status",
	"github.com/onceonly/checkout/internal/refunds": "Status",
}

// intentOnlyWords are the PaymentIntent statuses no other Stripe object or
// lifecycle of the service uses: written as a literal anywhere outside the
// owner, they can only be a PaymentIntent status. (succeeded, canceled and
// requires_action are also refund, outcome and order words: the typed
// check below finds those.)
var intentOnlyWords = []string{"requires_payment_method", "requires_confirmation", "requires_capture", "processing"}

// TestNoStatusLiteral: no service package writes a status of another
// package's lifecycle (lifecycles) as a string literal; each names the
// owner's constant. Two checks: a literal whose type is an owner's Status
// (found by type-checking every package that imports an owner, so
// `pi.Status == "succeeded"` is caught), and a literal holding a word only
// a PaymentIntent status uses, whatever its type. internal/stripeemu is
// left out: it plays Stripe itself, writing the wire.
func TestNoStatusLiteral(t *testing.T) {
	var found []string
	serviceFiles(t, []string{"internal/stripeintent", "internal/stripeemu", "internal/architecture"}, func(path, rel string) {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil && slices.Contains(intentOnlyWords, v) {
					found = append(found, rel+":"+strconv.Itoa(fset.Position(lit.Pos()).Line)+" "+lit.Value)
				}
			}
			return true
		})
	})
	found = append(found, typedStatusLiterals(t)...)
	for _, f := range found {
		t.Errorf("%s is a status written as a literal outside its owner: use the owner's constant", f)
	}
}

// typedStatusLiterals type-checks, from source, each service package that
// imports an owner of lifecycles (its dependencies from the export data
// `go list -export` gives) and returns the string literals whose type is
// another package's Status.
func typedStatusLiterals(t *testing.T) []string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-export", "-json=ImportPath,Dir,GoFiles,Export,Imports,Standard", "./cmd/...", "./internal/...")
	cmd.Dir = root
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	type pkg struct {
		ImportPath, Dir, Export string
		GoFiles, Imports        []string
		Standard                bool
	}
	exports := map[string]string{}
	var importers []pkg
	for dec := json.NewDecoder(&out); ; {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		for owner := range lifecycles {
			if slices.Contains(p.Imports, owner) {
				importers = append(importers, p)
				break
			}
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) })
	var found []string
	for _, p := range importers {
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
		if _, err := (&types.Config{Importer: imp}).Check(p.ImportPath, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", p.ImportPath, err)
		}
		for e, tv := range info.Types {
			lit, ok := e.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING || lit.Value == `""` { // "": no status
				continue
			}
			named, ok := tv.Type.(*types.Named)
			if !ok || named.Obj().Pkg() == nil {
				continue
			}
			if owner := named.Obj().Pkg().Path(); owner != p.ImportPath && lifecycles[owner] == named.Obj().Name() {
				pos := fset.Position(lit.Pos())
				rel, _ := filepath.Rel(root, pos.Filename)
				found = append(found, filepath.ToSlash(rel)+":"+strconv.Itoa(pos.Line)+" "+lit.Value)
			}
		}
	}
	return found
}

// TestConfigIsALeaf: internal/config reads the environment into the
// structs it is given and imports no package of the service: each
// mechanism declares and checks its own settings (rabbitmq.Settings), so
// reading configuration never pulls in a broker client.
func TestConfigIsALeaf(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "config", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, "github.com/onceonly/checkout/") {
				t.Errorf("%s imports %s: internal/config imports no package of the service", filepath.ToSlash(path), p)
			}
		}
	}
}
