package docs

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// forkPath is the module path TestForkBuilds gives its fork, as in
// docs/fork.md: gonew github.com/onceonly/checkout example.com/yourshop.
const forkPath = "example.com/yourshop"

// forkUnitTests are the packages whose tests TestForkBuilds runs in the
// fork: the unit tests that need no PostgreSQL, Redis or RabbitMQ, and the
// docs and architecture checks (the fork inherits them).
var forkUnitTests = []string{
	"./client", "./internal/architecture", "./internal/auth", "./internal/config",
	"./internal/httpbody", "./internal/ids", "./internal/problem", "./internal/ratelimit",
}

// TestForkBuilds: the tree that gonew makes of this module under another
// module path builds, passes go vet and its unit tests (docs/fork.md).
// gonew (golang.org/x/tools/cmd/gonew) downloads its source from a module
// proxy, which this module is not on, so the test copies the module's
// files (git ls-files, as a module zip holds them) and applies gonew's
// rewrite itself, as its fixGoMod and fixGo do: the module line of go.mod,
// and every import path under the old module path in every .go file;
// nothing else (strings and other files keep the old path). So a file
// that spells the module path outside an import breaks here, not in a
// fork.
func TestForkBuilds(t *testing.T) {
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	src := modulePath(t)
	out, err := exec.Command("git", "-C", abs, "ls-files", "--cached", "--others", "--exclude-standard", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	dst := t.TempDir()
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		data, err := os.ReadFile(filepath.Join(abs, rel))
		if os.IsNotExist(err) {
			continue // deleted in the working tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case rel == "go.mod":
			data = forkGoMod(t, data, forkPath)
		case strings.HasSuffix(rel, ".go"):
			data = forkGo(t, rel, data, src, forkPath)
		}
		file := filepath.Join(dst, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gocmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dst
		// The fork has no network either: every module it needs is the
		// original's, already in the module cache.
		cmd.Env = append(os.Environ(), "GOPROXY=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("fork: go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	gocmd("build", "./...")
	gocmd("vet", "./...")
	gocmd(append([]string{"test", "-count=1"}, forkUnitTests...)...)
	gocmd("test", "-count=1", "-run", "TestLinksResolve|TestCodeNamesExist|TestSnippetsCompile", "./internal/docs")
}

// forkGoMod is gonew's fixGoMod: go.mod with its module line naming dst.
func forkGoMod(t *testing.T, data []byte, dst string) []byte {
	t.Helper()
	lines := strings.Split(string(data), "\n")
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "module ") {
			lines[i] = "module " + dst
			return []byte(strings.Join(lines, "\n"))
		}
	}
	t.Fatal("go.mod has no module line")
	return nil
}

// forkGo is gonew's fixGo: the Go file data with every import of srcMod
// or a package under it importing the same package under dstMod. (gonew
// also renames a root package named for the module; this module has no Go
// file at its root.)
func forkGo(t *testing.T, name string, data []byte, srcMod, dstMod string) []byte {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, data, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	if dir := path.Dir(name); dir == "." {
		t.Fatalf("%s: a Go file at the module's root, which gonew would rename the package of", name)
	}
	type edit struct {
		from, to int
		text     string
	}
	var edits []edit
	for _, spec := range f.Imports {
		p, err := strconv.Unquote(spec.Path.Value)
		if err != nil || (p != srcMod && !strings.HasPrefix(p, srcMod+"/")) {
			continue
		}
		edits = append(edits, edit{fset.Position(spec.Path.Pos()).Offset, fset.Position(spec.Path.End()).Offset,
			strconv.Quote(dstMod + strings.TrimPrefix(p, srcMod))})
	}
	slices.SortFunc(edits, func(a, b edit) int { return b.from - a.from })
	out := slices.Clone(data)
	for _, e := range edits {
		out = slices.Concat(out[:e.from], []byte(e.text), out[e.to:])
	}
	return out
}
