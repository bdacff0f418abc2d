package docs

import (
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// modulePath returns the module's path, as go.mod declares it (a fork made
// by gonew has its own).
func modulePath(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(path), `"`)
		}
	}
	t.Fatal("go.mod has no module line")
	return ""
}

// stdImports are the standard packages a snippet may use without an
// import line, by the name it uses.
var stdImports = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "http": "net/http", "io": "io",
	"json": "encoding/json", "log": "log", "os": "os", "slog": "log/slog", "strings": "strings",
	"time": "time", "signal": "os/signal", "syscall": "syscall",
}

// declarations matches a snippet of top-level declarations: the body of
// a file without its package clause.
var declarations = regexp.MustCompile(`^(?://[^\n]*\n|\s)*(func|type|var|const) `)

// pkgUse is a package name followed by a selector in a snippet.
var pkgUse = regexp.MustCompile(`\b([a-z]\w*)\.[A-Za-z_]`)

// TestSnippetsCompile: every Go snippet (a ```go block) of README.md and
// docs/*.md compiles. A snippet with a package clause
// is a file of its own; any other is the body of a function
//
//	func snippet(ctx context.Context)
//
// with the imports of the packages it names (the standard ones in
// stdImports and the module's own, by name) added: so it can use ctx, and
// must use every variable it declares, as code a reader pastes would. A
// snippet of top-level declarations (a test to paste into tests/model) is
// parsed, not compiled: the package it belongs to is not named.
func TestSnippetsCompile(t *testing.T) {
	m := loadIndex(t)
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for _, p := range pages(t) {
		if p.path != "README.md" && !strings.HasPrefix(p.path, "docs/") {
			continue
		}
		for _, b := range p.blocks {
			if b.lang != "go" {
				continue
			}
			name := fmt.Sprintf("%s_%d", strings.NewReplacer("/", "_", ".", "_", "-", "_").Replace(p.path), b.line)
			src := b.text
			if declarations.MatchString(src) {
				// Declarations to paste into a package of the module
				// (a test of tests/model): parsed, not type-checked here.
				if _, err := parser.ParseFile(token.NewFileSet(), fmt.Sprintf("%s:%d", p.path, b.line+1), "package snippet\n"+src, 0); err != nil {
					t.Errorf("the snippet at %s:%d does not parse: %v", p.path, b.line, err)
				}
				continue
			}
			if !strings.HasPrefix(strings.TrimSpace(src), "package ") && !strings.Contains(src, "\npackage ") {
				src = wrapSnippet(t, m, p.path, b)
			}
			file := filepath.Join(tmp, name+".go")
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			// The snippet's package is a directory of the module that does
			// not exist on disk, only in the overlay.
			dir := filepath.Join(abs, "internal", "docs", "snippets", name)
			overlay[filepath.Join(dir, "snippet.go")] = file
			pkgs = append(pkgs, "./"+filepath.ToSlash(filepath.Join("internal", "docs", "snippets", name)))
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("no Go snippet found: README.md has one")
	}
	js, _ := json.Marshal(map[string]any{"Replace": overlay})
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, js, 0o644); err != nil {
		t.Fatal(err)
	}
	slices.Sort(pkgs)
	cmd := exec.Command("go", append([]string{"build", "-o", os.DevNull, "-overlay=" + ov}, pkgs...)...)
	cmd.Dir = abs
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("the snippets do not compile (go build %v): %v\n%s", pkgs, err, out)
	}
}

// wrapSnippet makes a file of the function-body snippet b of page path.
func wrapSnippet(t *testing.T, m *moduleIndex, path string, b block) string {
	t.Helper()
	imports := map[string]string{"context": "context"}
	for _, u := range pkgUse.FindAllStringSubmatch(b.text, -1) {
		name := u[1]
		if ip, ok := stdImports[name]; ok {
			imports[name] = ip
			continue
		}
		if p := m.byName[name]; p != nil && len(p.dirs) > 0 {
			imports[name] = modulePath(t) + "/" + p.dirs[0]
		}
	}
	var src strings.Builder
	fmt.Fprintf(&src, "// Code from %s:%d.\n\npackage snippet\n\nimport (\n", path, b.line)
	names := make([]string, 0, len(imports))
	for n := range imports {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&src, "\t%s %q\n", n, imports[n])
	}
	fmt.Fprintf(&src, ")\n\nfunc snippet(ctx context.Context) {\n//line %s:%d\n", path, b.line+1)
	src.WriteString(b.text)
	src.WriteString("}\n")
	return src.String()
}
