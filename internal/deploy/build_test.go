package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/version"
	"io/fs"
	"maps"
	"os"
	"os/exec"
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
	return parseDockerfile(string(b))
}

func parseDockerfile(text string) []string {
	var out []string
	cur := ""
	for _, line := range strings.Split(text, "\n") {
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

// stage is one FROM of the Dockerfile: its base (an image, or an earlier
// stage's name), its name and its own instructions.
type stage struct {
	base, name string
	body       []string
}

// stages splits the Dockerfile's instructions by FROM.
func stages(instructions []string) []stage {
	var out []stage
	for _, in := range instructions {
		f := strings.Fields(in)
		if len(f) > 0 && strings.EqualFold(f[0], "FROM") {
			f = slices.DeleteFunc(f[1:], func(s string) bool { return strings.HasPrefix(s, "--") })
			s := stage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			out = append(out, s)
			continue
		}
		if len(out) > 0 {
			out[len(out)-1].body = append(out[len(out)-1].body, in)
		}
	}
	return out
}

// chain returns the instructions that make stage name, those of the stages
// it is built FROM first, and the image at the bottom of the chain. A FROM
// names the last stage of that name above it.
func chain(t *testing.T, instructions []string, name string) (image string, body []string) {
	t.Helper()
	all := stages(instructions)
	end := len(all)
	var bodies [][]string
	for {
		i := end - 1
		for i >= 0 && all[i].name != name {
			i--
		}
		if i < 0 {
			break
		}
		bodies = append(bodies, all[i].body)
		name, end = all[i].base, i
	}
	require.NotEmpty(t, bodies, "the Dockerfile has no stage %s", name)
	for i := len(bodies) - 1; i >= 0; i-- {
		body = append(body, bodies[i]...)
	}
	return name, body
}

// goBuilds returns the Dockerfile's RUN instructions that run go build, by
// the name of the stage that runs them, one per stage.
func goBuilds(t *testing.T, instructions []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, s := range stages(instructions) {
		for _, in := range s.body {
			if strings.HasPrefix(in, "RUN ") && strings.Contains(in, "go build") {
				_, dup := out[s.name]
				require.False(t, dup, "one go build in stage %s", s.name)
				require.NotEmpty(t, s.name, "a go build in an unnamed stage")
				out[s.name] = in
			}
		}
	}
	require.NotEmpty(t, out, "a go build")
	return out
}

func TestDockerfileBuildsWhatComposeRuns(t *testing.T) {
	t.Parallel()
	instructions := dockerfile(t)
	builds := goBuilds(t, instructions)
	var built []string
	for _, run := range builds {
		require.Contains(t, run, `go build -trimpath -ldflags="-s -w" -o /out/ `)
		built = append(built, builtPackages(run)...)
	}
	require.Equal(t, "all", lastStage(instructions))

	// The images ship exactly the binaries the compose file runs: each one
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
	slices.Sort(built)
	require.ElementsMatch(t, slices.Compact(commands), slices.Compact(built))
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
	all := stages(instructions)
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1].name
}

// shipped lists, sorted, the binaries stage copies from a go build stage's
// /out/ (every binary that stage's go build makes for "/out/"), in the
// stage's last definition and the stages it is built FROM.
func shipped(t *testing.T, instructions []string, name string) []string {
	t.Helper()
	_, body := chain(t, instructions, name)
	builds := goBuilds(t, instructions)
	var bins []string
	for _, ins := range body {
		f := strings.Fields(ins)
		if len(f) < 3 || f[0] != "COPY" || !strings.HasPrefix(f[1], "--from=") {
			continue
		}
		run, ok := builds[strings.TrimPrefix(f[1], "--from=")]
		if !ok {
			continue
		}
		for _, src := range f[2 : len(f)-1] {
			if src == "/out/" {
				for _, pkg := range builtPackages(run) {
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
	for stage, run := range goBuilds(t, dockerfile(t)) {
		for _, target := range []string{"/go/pkg/mod", "/root/.cache/go-build"} {
			require.Regexp(t, `--mount=type=cache,(?:[a-z]+=[^ ,]+,)*target=`+regexp.QuoteMeta(target)+`(?:[, ]|$)`, run,
				"a BuildKit cache mount on %s in stage %s", target, stage)
		}
	}
}

// TestGoImageSatisfiesGoMod: a tag below go.mod's go line (golang:1.26 for
// go 1.26.8 is any cached 1.26.x) makes the build download a toolchain or fail.
func TestGoImageSatisfiesGoMod(t *testing.T) {
	t.Parallel()
	want := goModVersion(t)
	var tags []string
	for _, s := range stages(dockerfile(t)) {
		if tag, ok := strings.CutPrefix(s.base, "golang:"); ok {
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

// TestImagesRunAsUser10001: every image the Dockerfile makes for a process
// runs as uid and gid 10001, numerically (Kubernetes' runAsNonRoot can only
// verify a numeric USER, and deploy/k8s sets runAsUser and fsGroup 10001),
// and the image has that user and group, so the process has a name and a
// group in /etc/passwd and /etc/group.
func TestImagesRunAsUser10001(t *testing.T) {
	t.Parallel()
	instructions := dockerfile(t)
	for _, s := range stages(instructions) {
		if _, golang := goBuilds(t, instructions)[s.name]; golang || s.name == "" || !slices.ContainsFunc(s.body, isCopyFromBuild) {
			continue // a build stage or a base, not an image a process runs
		}
		require.NoError(t, runsAs10001(t, instructions, s.name), s.name)
	}

	// The check itself: the stages of issue 34, USER app.
	old := parseDockerfile("FROM alpine:3.22 AS all\nRUN adduser -D -u 10001 app\nCOPY --from=build /out/api /usr/local/bin/\nUSER app\n")
	require.ErrorContains(t, runsAs10001(t, old, "all"), `USER app`)
	noGroup := parseDockerfile("FROM alpine:3.22 AS all\nRUN adduser -D -u 10001 app\nUSER 10001:10001\n")
	require.ErrorContains(t, runsAs10001(t, noGroup, "all"), "group 10001")
}

func isCopyFromBuild(in string) bool { return strings.HasPrefix(in, "COPY --from=") }

// runsAs10001 fails a stage whose effective USER is not 10001:10001 or whose
// chain does not create group 10001 and user 10001 in it (busybox addgroup
// -g and adduser -u ... -G on Alpine).
func runsAs10001(t *testing.T, instructions []string, name string) error {
	_, body := chain(t, instructions, name)
	user := ""
	var runs string
	for _, in := range body {
		if u, ok := strings.CutPrefix(in, "USER "); ok {
			user = strings.TrimSpace(u)
		}
		if r, ok := strings.CutPrefix(in, "RUN "); ok {
			runs += r + "\n"
		}
	}
	if user != "10001:10001" {
		return fmt.Errorf("USER %s, not USER 10001:10001", user)
	}
	group := regexp.MustCompile(`addgroup (?:-\S+ )*-g 10001 (?:-\S+ )*(\w+)`).FindStringSubmatch(runs)
	if group == nil {
		return fmt.Errorf("no addgroup -g 10001: the image has no group 10001")
	}
	if !regexp.MustCompile(`adduser (?:-\S+ )*-u 10001 (?:-\S+ )*-G ` + group[1] + `\b`).MatchString(runs) {
		return fmt.Errorf("no adduser -u 10001 -G %s: the image has no user 10001 in group 10001", group[1])
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

func dockerignore(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	require.NoError(t, err)
	return string(b)
}

// outputs are files a developer's work tree has that no build needs.
var outputs = []string{
	".git", ".git/HEAD", ".git/objects/pack/pack-1.pack", ".env",
	"bin/api", "bin/worker", "tmp/api.log",
	"api.test", "checkout.test", "internal/api/api.test", "cmd/api/api.test",
	"coverage.out", "cover.out", "coverage.html", "internal/outbox/coverage.out", "cpu.prof", "internal/api/mem.prof",
	"internal/api/api_test.go", "internal/api/testdata/body.json", "client/client_test.go",
	"docker-compose.yml", "README.md", "docs/DESIGN.md", "tests/e2e/e2e_test.go",
}

// contextDefects reports a developer's output in the context, and a file in
// it outside every top-level folder the build reads from (an edit to it would
// invalidate the build's layers for nothing).
func contextDefects(inContext func(string) bool, files []string, needed map[string]bool) error {
	var errs []string
	for _, f := range outputs {
		if inContext(f) {
			errs = append(errs, "context includes "+f)
		}
	}
	read := map[string]bool{}
	for f := range needed {
		top, _, _ := strings.Cut(f, "/")
		read[top] = true
	}
	for _, f := range files {
		top, _, _ := strings.Cut(f, "/")
		if inContext(f) && !read[top] {
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
	files := repoFiles(t)
	instructions := dockerfile(t)
	needed := map[string]bool{}
	for name := range goBuilds(t, instructions) {
		for _, n := range buildNeeds(t, goStageOf(t, instructions, name)) {
			needed[n.file] = true
		}
	}
	require.NoError(t, contextDefects(buildContext(t, dockerignore(t)), files, needed))

	// The check itself: the .dockerignore of issue 8 fails it.
	old := buildContext(t, ".git\n**/*_test.go\ntmp\n")
	err := contextDefects(old, files, needed)
	require.ErrorContains(t, err, "context includes bin/api")
	require.ErrorContains(t, err, "context includes api.test")
	require.ErrorContains(t, err, "context includes coverage.out")
	require.ErrorContains(t, err, "context includes README.md, which the build does not read")
}

// goStage is a stage of the Dockerfile that runs go build, as BuildKit would
// run it: the files its COPY instructions place, by their path under the
// build's WORKDIR, taken from the build context .dockerignore admits.
type goStage struct {
	name string
	// env holds the stage's ENV, KEY=value.
	env []string
	// files maps a path under the go build's WORKDIR to the context file
	// copied there.
	files map[string]string
	// context is every file of the build context.
	context map[string]bool
	// build is the go build command, without RUN and BuildKit's mounts.
	build string
	// errs are COPY sources the context lacks, on which BuildKit stops.
	errs []string
}

// goStageOf reads stage name, with the stages it is built FROM, against the
// build context the work tree and .dockerignore make.
func goStageOf(t *testing.T, instructions []string, name string) goStage {
	t.Helper()
	return goStageIn(t, instructions, name, buildContext(t, dockerignore(t)), cloneFiles(t))
}

// cloneFiles lists the files a clean clone would have once the work tree is
// committed: tracked or untracked, and not ignored by git (bin/, .env, ...
// never reach a clone, whatever .dockerignore says). Without git (a copy of
// the tree), the work tree's files.
func cloneFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return repoFiles(t)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		// A file deleted but not yet committed is listed by --cached.
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(f))); err == nil {
			files = append(files, f)
		}
	}
	require.Contains(t, files, "go.mod")
	return files
}

// goStageIn is goStageOf with the context given: files admitted by inContext.
// It handles the COPY forms the Dockerfile uses (files and directories of the
// context, no wildcards, no --from) as the Dockerfile reference describes
// them: a directory's contents, not the directory itself, go to dest
// (https://docs.docker.com/reference/dockerfile/#copy).
func goStageIn(t *testing.T, instructions []string, name string, inContext func(string) bool, files []string) goStage {
	t.Helper()
	image, body := chain(t, instructions, name)
	require.True(t, strings.HasPrefix(image, "golang:"), "stage %s builds FROM %s, not a golang image", name, image)
	s := goStage{name: name, files: map[string]string{}, context: map[string]bool{}}
	for _, f := range files {
		if inContext(f) {
			s.context[f] = true
		}
	}
	placed := map[string]string{} // absolute path in the stage -> context file
	workdir, buildDir := "/", ""
	for _, in := range body {
		f := strings.Fields(in)
		switch strings.ToUpper(f[0]) {
		case "WORKDIR":
			workdir = path.Join(workdir, f[1])
		case "ENV":
			for _, kv := range f[1:] {
				require.Contains(t, kv, "=", "stage %s: ENV KEY=value", name)
				s.env = append(s.env, kv)
			}
		case "COPY":
			args := slices.DeleteFunc(f[1:], func(a string) bool {
				require.False(t, strings.HasPrefix(a, "--from="), "stage %s: a go build stage copies from the context only", name)
				return strings.HasPrefix(a, "--")
			})
			require.GreaterOrEqual(t, len(args), 2, "stage %s: %s", name, in)
			srcs, dest := args[:len(args)-1], args[len(args)-1]
			if !path.IsAbs(dest) {
				dest = path.Join(workdir, dest)
			}
			intoDir := strings.HasSuffix(args[len(args)-1], "/") || len(srcs) > 1
			for _, src := range srcs {
				require.False(t, strings.ContainsAny(src, "*?["), "stage %s: wildcards are not read here: %s", name, in)
				src = strings.Trim(path.Clean(src), "/")
				switch {
				case s.context[src]:
					if intoDir {
						placed[path.Join(dest, path.Base(src))] = src
					} else {
						placed[dest] = src
					}
				default:
					found := false
					for c := range s.context {
						if rel, ok := strings.CutPrefix(c, src+"/"); ok || src == "." {
							if src == "." {
								rel = c
							}
							placed[path.Join(dest, rel)] = c
							found = true
						}
					}
					if !found {
						s.errs = append(s.errs, fmt.Sprintf("stage %s: COPY %s: nothing of it is in the build context", name, src))
					}
				}
			}
		case "RUN":
			if !strings.Contains(in, "go build") {
				continue
			}
			rest := strings.TrimSpace(in[len("RUN"):])
			for strings.HasPrefix(rest, "--") {
				_, rest, _ = strings.Cut(rest, " ")
				rest = strings.TrimSpace(rest)
			}
			s.build, buildDir = rest, workdir
		}
	}
	require.NotEmpty(t, s.build, "stage %s runs no go build", name)
	for abs, src := range placed {
		if rel, ok := strings.CutPrefix(abs, strings.TrimSuffix(buildDir, "/")+"/"); ok {
			s.files[rel] = src
		}
	}
	return s
}

// need is a file a go build reads: a source or embedded file of a package of
// the module, or go.mod or go.sum.
type need struct {
	file string
	// pkg is the package that reads it; importedBy, the module's packages
	// that import pkg.
	pkg        string
	importedBy []string
}

// buildNeeds asks `go list -deps -json` which files the stage's go build
// reads from the module, for linux with the stage's ENV (CGO_ENABLED=0
// leaves cgo files out): every file list of every package of the module the
// built packages depend on, embedded files included.
func buildNeeds(t *testing.T, s goStage) []need {
	t.Helper()
	return packageNeeds(t, s, builtPackages(s.build))
}

// packageNeeds is buildNeeds for the given packages of the stage's build.
func packageNeeds(t *testing.T, s goStage, packages []string) []need {
	t.Helper()
	args := append([]string{"list", "-deps", "-json"}, packages...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = goEnv(s)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())

	type pkg struct {
		ImportPath, Dir string
		Module          *struct {
			Path, Dir string
			Main      bool
		}
		GoFiles, CgoFiles, CFiles, CXXFiles, MFiles, HFiles, FFiles, SFiles []string
		SwigFiles, SwigCXXFiles, SysoFiles, EmbedFiles                      []string
		Imports                                                             []string
		Error                                                               *struct{ Err string }
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		require.NoError(t, dec.Decode(&p))
		require.Nil(t, p.Error, "go list %s", p.ImportPath)
		if p.Module != nil && p.Module.Main {
			pkgs = append(pkgs, p)
		}
	}
	require.NotEmpty(t, pkgs)
	needs := []need{{file: "go.mod", pkg: pkgs[0].Module.Path}, {file: "go.sum", pkg: pkgs[0].Module.Path}}
	for _, p := range pkgs {
		var importers []string
		for _, q := range pkgs {
			if slices.Contains(q.Imports, p.ImportPath) {
				importers = append(importers, q.ImportPath)
			}
		}
		for _, list := range [][]string{p.GoFiles, p.CgoFiles, p.CFiles, p.CXXFiles, p.MFiles, p.HFiles, p.FFiles,
			p.SFiles, p.SwigFiles, p.SwigCXXFiles, p.SysoFiles, p.EmbedFiles} {
			for _, f := range list {
				rel, err := filepath.Rel(p.Module.Dir, filepath.Join(p.Dir, f))
				require.NoError(t, err)
				needs = append(needs, need{file: filepath.ToSlash(rel), pkg: p.ImportPath, importedBy: importers})
			}
		}
	}
	return needs
}

// goEnv is the environment of the stage's go commands: this one's, with the
// stage's ENV, for linux (the images'), and without a GOFLAGS or a go.work
// of the developer's that the image does not have.
func goEnv(s goStage) []string {
	return append(os.Environ(), append([]string{"GOOS=linux", "GOFLAGS=", "GOWORK=off"}, s.env...)...)
}

// stageDefects reports a file the stage's go build reads that the stage does
// not have where the module has it, saying whether .dockerignore or the
// stage's COPYs leave it out.
func stageDefects(s goStage, needs []need) error {
	errs := slices.Clone(s.errs)
	for _, n := range needs {
		if s.files[n.file] == n.file {
			continue
		}
		why := "no COPY of the stage places it"
		if !s.context[n.file] {
			why = ".dockerignore leaves it out of the build context"
		}
		by := ""
		if len(n.importedBy) > 0 {
			by = ", imported by " + strings.Join(n.importedBy, ", ")
		}
		errs = append(errs, fmt.Sprintf("stage %s: the build reads %s (package %s%s), but %s", s.name, n.file, n.pkg, by, why))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// buildInFolder runs the stage's go build, as the Dockerfile writes it, in a
// new folder holding only the files the stage places, and checks that it
// makes a binary for each package it builds.
func buildInFolder(t *testing.T, s goStage) error {
	t.Helper()
	dir, out := t.TempDir(), t.TempDir()
	for dst, src := range s.files {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(src)))
		require.NoError(t, err)
		p := filepath.Join(dir, filepath.FromSlash(dst))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, b, 0o644))
	}
	// /bin/sh -c, as RUN's shell form; /out/ is where the stage's
	// binaries go.
	cmd := exec.Command("/bin/sh", "-c", strings.ReplaceAll(s.build, "/out/", out+"/"))
	cmd.Dir = dir
	cmd.Env = goEnv(s)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("stage %s: %s: %w\n%s", s.name, s.build, err, b)
	}
	for _, pkg := range builtPackages(s.build) {
		if _, err := os.Stat(filepath.Join(out, path.Base(pkg))); err != nil {
			return fmt.Errorf("stage %s made no %s: %w", s.name, path.Base(pkg), err)
		}
	}
	return nil
}

// TestImageBuildsFromItsContext (issue 34): each go build of the Dockerfile,
// for every binary of every target, succeeds in a folder that holds only what
// its stage copies of the build context .dockerignore admits from a clean
// clone's files, and that folder holds every file `go list -deps` says the
// build reads.
func TestImageBuildsFromItsContext(t *testing.T) {
	t.Parallel()
	instructions := dockerfile(t)
	names := slices.Sorted(maps.Keys(goBuilds(t, instructions)))
	for _, name := range names {
		// One at a time: each is a go build.
		t.Run(name, func(t *testing.T) {
			s := goStageOf(t, instructions, name)
			require.NoError(t, stageDefects(s, buildNeeds(t, s)))
			require.NoError(t, buildInFolder(t, s))
		})
	}
}

// issue34Dockerignore is the .dockerignore of issue 34, without client/.
const issue34Dockerignore = "*\n!go.mod\n!go.sum\n!cmd/\n!internal/\n!migrations/\n**/*_test.go\n**/testdata/\n"

// TestBuildOfIssue34Fails: the checks of TestImageBuildsFromItsContext fail
// the context of issue 34, each naming the package it lacks.
func TestBuildOfIssue34Fails(t *testing.T) {
	t.Parallel()
	instructions := dockerfile(t)
	s := goStageIn(t, instructions, "build", buildContext(t, issue34Dockerignore), cloneFiles(t))
	err := stageDefects(s, buildNeeds(t, s))
	require.ErrorContains(t, err, "the build reads client/client.go (package github.com/onceonly/checkout/client, imported by github.com/onceonly/checkout/internal/storefront), but .dockerignore leaves it out")
	// The go build stops while loading the packages: no compiling.
	err = buildInFolder(t, s)
	require.ErrorContains(t, err, "no required module provides package github.com/onceonly/checkout/client")
}

// TestEmulatorImageChangesOnlyWithTheEmulator (issue 34): compose's
// stripe-emulator builds a target that ships the emulator alone, from a go
// build stage that copies only the files of the emulator's packages. An edit
// to any other file then leaves its layers cached and the image as it was, so
// `docker compose up --build` keeps its container and the PaymentIntents and
// refunds it holds in memory. (BuildKit keys a COPY by its files' contents:
// https://docs.docker.com/build/cache/invalidation/.) That its stage holds
// every file the emulator's build reads is TestImageBuildsFromItsContext's.
func TestEmulatorImageChangesOnlyWithTheEmulator(t *testing.T) {
	t.Parallel()
	instructions := dockerfile(t)
	emu, err := loadProject(t).GetService("stripe-emulator")
	require.NoError(t, err)
	require.NotNil(t, emu.Build)
	require.NoError(t, emulatorImageDefects(t, instructions, emu.Build.Target))

	// The check itself: the emulator of issue 34, the dev target, whose
	// binaries all come from one COPY . . of the whole context.
	err = emulatorImageDefects(t, instructions, "dev")
	require.ErrorContains(t, err, "target dev ships [api dispatcher migrate storefront stripe-emulator worker]")
	require.ErrorContains(t, err, "stage build copies")
	require.ErrorContains(t, err, "client/client.go")
}

// emulatorImageDefects reports a target that ships more than the Stripe
// emulator, and a file its go build stages copy outside the directories of
// the emulator's packages (go.mod and go.sum aside).
func emulatorImageDefects(t *testing.T, instructions []string, target string) error {
	t.Helper()
	var errs []string
	if bins := shipped(t, instructions, target); !slices.Equal(bins, []string{"stripe-emulator"}) {
		errs = append(errs, fmt.Sprintf("target %s ships %v, not the emulator alone: an edit to any of them changes its image", target, bins))
	}
	_, body := chain(t, instructions, target)
	builds := goBuilds(t, instructions)
	for _, in := range body {
		f := strings.Fields(in)
		if len(f) < 2 || f[0] != "COPY" {
			continue
		}
		from, ok := strings.CutPrefix(f[1], "--from=")
		if _, isBuild := builds[from]; !ok || !isBuild {
			continue
		}
		s := goStageOf(t, instructions, from)
		dirs := map[string]bool{}
		for _, n := range packageNeeds(t, s, []string{"./cmd/stripe-emulator"}) {
			dirs[path.Dir(n.file)] = true
		}
		var extra []string
		for dst := range s.files {
			if !dirs[path.Dir(dst)] {
				extra = append(extra, dst)
			}
		}
		slices.Sort(extra)
		if n := len(extra); n > 0 {
			errs = append(errs, fmt.Sprintf("stage %s copies %d files the emulator does not read, an edit to any of which rebuilds its image: %s",
				from, n, strings.Join(extra[:min(n, 5)], ", ")))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}
