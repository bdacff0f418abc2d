package deploy_test

import (
	"bufio"
	"fmt"
	"go/version"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"github.com/stretchr/testify/require"
)

// dockerfile returns the Dockerfile's instructions, continuation lines joined
// and comments dropped.
func dockerfile(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	var out []string
	cur := ""
	for _, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur == "") {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		cur += trimmed
		if cur != "" {
			out = append(out, cur)
		}
		cur = ""
	}
	return out
}

// goBuild returns the Dockerfile's RUN instruction that runs go build.
func goBuild(t *testing.T, instructions []string) string {
	t.Helper()
	var found []string
	for _, in := range instructions {
		if strings.HasPrefix(in, "RUN ") && strings.Contains(in, "go build") {
			found = append(found, in)
		}
	}
	require.Len(t, found, 1, "one go build")
	return found[0]
}

func TestDockerfileBuildsWhatComposeRuns(t *testing.T) {
	t.Parallel()
	instructions := dockerfile(t)
	run := goBuild(t, instructions)
	require.Contains(t, run, `go build -trimpath -ldflags="-s -w" -o /out/ `)
	require.Contains(t, instructions, "FROM alpine:3.22 AS all")
	require.Contains(t, instructions, "FROM alpine:3.22 AS dev")
	require.Contains(t, instructions, "FROM alpine:3.22 AS single")

	// The image ships exactly the binaries the compose file runs: each one
	// is built from ./cmd, and nothing else (./cmd/... would add smtp-sink).
	var commands []string
	for _, s := range loadProject(t).Services {
		if len(s.Command) == 0 || s.Build == nil {
			continue // an image's own program (prometheus)
		}
		info, err := os.Stat(filepath.Join(root, "cmd", s.Command[0], "main.go"))
		require.NoError(t, err, "service %s runs %s", s.Name, s.Command[0])
		require.False(t, info.IsDir())
		commands = append(commands, "./cmd/"+s.Command[0])
	}
	require.ElementsMatch(t, commands, builtPackages(run))
	require.Error(t, shipsOnly(`RUN go build -o /out/ ./cmd/...`, commands), "the issue's build")
}

// TestDefaultImageLeavesOutTheEmulator (issue 20): the default target, all
// (the last stage), ships the api, the dispatcher and the worker and not the
// Stripe emulator, which answers any key and moves no money; the dev target
// ships it, and each compose service builds the stage that has its binary.
func TestDefaultImageLeavesOutTheEmulator(t *testing.T) {
	t.Parallel()
	instructions := dockerfile(t)
	require.Equal(t, "all", lastStage(instructions), "the default target")
	require.NoError(t, productionImage(t, instructions))
	for _, s := range loadProject(t).Services {
		if s.Build == nil {
			continue
		}
		require.Contains(t, shipped(t, instructions, s.Build.Target), s.Command[0],
			"%s builds %s, which ships its binary", s.Name, s.Build.Target)
	}
	require.Contains(t, shipped(t, instructions, "dev"), "stripe-emulator")

	// The check itself: the Dockerfile of issue 20 fails it.
	old := append(slices.Clone(instructions),
		"FROM alpine:3.22 AS all", "COPY --from=build /out/ /usr/local/bin/", `CMD ["api"]`)
	require.ErrorContains(t, productionImage(t, old), "stripe-emulator")
}

// productionImage fails a default target that ships a binary other than the
// three production processes and the migrate command.
func productionImage(t *testing.T, instructions []string) error {
	got := shipped(t, instructions, lastStage(instructions))
	if want := []string{"api", "dispatcher", "migrate", "worker"}; !slices.Equal(got, want) {
		return fmt.Errorf("the default target ships %v, not %v", got, want)
	}
	return nil
}

// lastStage names the Dockerfile's last stage, the default target.
func lastStage(instructions []string) string {
	name := ""
	for _, in := range instructions {
		if f := strings.Fields(in); len(f) == 4 && f[0] == "FROM" && strings.EqualFold(f[2], "AS") {
			name = f[3]
		}
	}
	return name
}

// shipped lists, sorted, the binaries a stage copies from the build stage's
// /out/ (every binary the go build makes for "/out/"), in the stage's last
// definition.
func shipped(t *testing.T, instructions []string, stage string) []string {
	t.Helper()
	var bins []string
	in := false
	for _, ins := range instructions {
		f := strings.Fields(ins)
		if len(f) > 0 && f[0] == "FROM" {
			in = len(f) == 4 && f[3] == stage
			if in {
				bins = nil
			}
			continue
		}
		if !in || len(f) < 3 || f[0] != "COPY" || f[1] != "--from=build" {
			continue
		}
		for _, src := range f[2 : len(f)-1] {
			if src == "/out/" {
				for _, pkg := range builtPackages(goBuild(t, instructions)) {
					bins = append(bins, path.Base(pkg))
				}
				continue
			}
			if b, ok := strings.CutPrefix(src, "/out/"); ok {
				bins = append(bins, b)
			}
		}
	}
	slices.Sort(bins)
	return bins
}

func builtPackages(run string) []string {
	var pkgs []string
	for _, f := range strings.Fields(run) {
		if strings.HasPrefix(f, "./") {
			pkgs = append(pkgs, f)
		}
	}
	return pkgs
}

func shipsOnly(run string, commands []string) error {
	for _, pkg := range builtPackages(run) {
		if !slices.Contains(commands, pkg) {
			return fmt.Errorf("builds %s, which no service runs", pkg)
		}
	}
	return nil
}

func TestDockerfileCachesTheGoBuild(t *testing.T) {
	t.Parallel()
	run := goBuild(t, dockerfile(t))
	for _, target := range []string{"/go/pkg/mod", "/root/.cache/go-build"} {
		require.Regexp(t, `--mount=type=cache,(?:[a-z]+=[^ ,]+,)*target=`+regexp.QuoteMeta(target)+`(?:[, ]|$)`, run,
			"a BuildKit cache mount on %s", target)
	}
}

// TestGoImageSatisfiesGoMod: a tag below go.mod's go line (golang:1.26 for
// go 1.26.8 is any cached 1.26.x) makes the build download a toolchain or fail.
func TestGoImageSatisfiesGoMod(t *testing.T) {
	t.Parallel()
	want := goModVersion(t)
	var tags []string
	for _, in := range dockerfile(t) {
		f := strings.Fields(in)
		if len(f) < 2 || f[0] != "FROM" {
			continue
		}
		image := f[1]
		if strings.HasPrefix(image, "--platform=") && len(f) > 2 {
			image = f[2]
		}
		if tag, ok := strings.CutPrefix(image, "golang:"); ok {
			tags = append(tags, tag)
		}
	}
	require.NotEmpty(t, tags, "a golang build stage")
	for _, tag := range tags {
		require.NoError(t, goTagSatisfies(tag, want))
	}
	require.Error(t, goTagSatisfies("1.26", "1.26.8"), "the issue's tag")
	require.Error(t, goTagSatisfies("latest", "1.26.8"))
	require.NoError(t, goTagSatisfies("1.26.8-bookworm", "1.26.8"))
	require.NoError(t, goTagSatisfies("1.27.1-alpine3.22", "1.26.8"))
}

func goModVersion(t *testing.T) string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "go "); ok {
			v = strings.TrimSpace(v)
			require.True(t, version.IsValid("go"+v), "go.mod's go line %q", v)
			return v
		}
	}
	require.NoError(t, sc.Err())
	t.Fatal("go.mod has no go line")
	return ""
}

func goTagSatisfies(tag, goMod string) error {
	v, _, _ := strings.Cut(tag, "-")
	if !version.IsValid("go" + v) {
		return fmt.Errorf("golang:%s names no Go version", tag)
	}
	if version.Compare("go"+v, "go"+goMod) < 0 {
		return fmt.Errorf("golang:%s may be older than go.mod's go %s", tag, goMod)
	}
	return nil
}

// buildContext is the build context's matcher, read from .dockerignore as docker
// and BuildKit read it.
func buildContext(t *testing.T, dockerignore string) func(string) bool {
	t.Helper()
	patterns, err := ignorefile.ReadAll(strings.NewReader(dockerignore))
	require.NoError(t, err)
	pm, err := patternmatcher.New(patterns)
	require.NoError(t, err)
	return func(file string) bool {
		excluded, err := pm.MatchesOrParentMatches(file)
		require.NoError(t, err)
		return !excluded
	}
}

// outputs are files a developer's work tree has that no build needs.
var outputs = []string{
	".git", ".git/HEAD", ".git/objects/pack/pack-1.pack",
	"bin/api", "bin/worker", "tmp/api.log",
	"api.test", "checkout.test", "internal/api/api.test", "cmd/api/api.test",
	"coverage.out", "cover.out", "coverage.html", "internal/outbox/coverage.out", "cpu.prof", "internal/api/mem.prof",
	"internal/api/api_test.go", "internal/api/testdata/body.json",
	"docker-compose.yml", "README.md", "docs/DESIGN.md", "tests/e2e/e2e_test.go",
}

// needed reports whether the build reads file: go.mod, go.sum, and the
// non-test sources and embedded files of cmd/, internal/ and migrations/.
func needed(file string) bool {
	if file == "go.mod" || file == "go.sum" {
		return true
	}
	top, _, _ := strings.Cut(file, "/")
	if top != "cmd" && top != "internal" && top != "migrations" {
		return false
	}
	if strings.HasSuffix(file, "_test.go") || strings.Contains("/"+file+"/", "/testdata/") {
		return false
	}
	return strings.HasSuffix(file, ".go") || (top == "migrations" && path.Ext(file) == ".sql")
}

func contextDefects(t *testing.T, inContext func(string) bool, files []string) error {
	var errs []string
	for _, f := range outputs {
		if inContext(f) {
			errs = append(errs, "context includes "+f)
		}
	}
	for _, f := range files {
		if needed(f) && !inContext(f) {
			errs = append(errs, "context lacks "+f)
		}
		if !needed(f) && inContext(f) && !strings.HasPrefix(f, "internal/") && !strings.HasPrefix(f, "cmd/") {
			errs = append(errs, "context includes "+f+", which the build does not read")
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// repoFiles lists the work tree's files (slash paths from the root), .git and
// other dot-directories left out, and the real outputs of a `make build` or
// a test run included when present.
func repoFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, files, "go.mod")
	return files
}

func TestDockerignoreKeepsTheContextToTheBuild(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	require.NoError(t, err)
	files := repoFiles(t)
	require.NoError(t, contextDefects(t, buildContext(t, string(b)), files))

	// The check itself: the .dockerignore of issue 8 fails it.
	old := buildContext(t, ".git\n**/*_test.go\ntmp\n")
	err = contextDefects(t, old, files)
	require.ErrorContains(t, err, "context includes bin/api")
	require.ErrorContains(t, err, "context includes api.test")
	require.ErrorContains(t, err, "context includes coverage.out")
}
