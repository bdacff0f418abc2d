package deploy_test

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rhysd/actionlint"
)

// TestGitHubWorkflowLints checks .github/workflows/ci.yml with actionlint
// (syntax, expressions, action inputs, runner labels), since GitHub's CI
// cannot run here; and that it runs the README's test command against
// service containers of the three servers.
func TestGitHubWorkflowLints(t *testing.T) {
	t.Parallel()
	path := filepath.Join(root, ".github", "workflows", "ci.yml")
	linter, err := actionlint.NewLinter(io.Discard, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	errs, err := linter.LintFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Errorf("%s:%d:%d: %s [%s]", path, e.Line, e.Column, e.Message, e.Kind)
	}

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	wf := string(b)
	for _, want := range []string{"run: make test", "image: postgres:", "image: redis:", "image: rabbitmq:"} {
		if !strings.Contains(wf, want) {
			t.Errorf("ci.yml lacks %q", want)
		}
	}
}

// TestWorkflowLintCatchesAMistake: a broken workflow fails the lint, so
// the test above would notice one.
func TestWorkflowLintCatchesAMistake(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "ci.yml"))
	if err != nil {
		t.Fatal(err)
	}
	wf := string(b)
	broken := strings.Replace(wf, "runs-on: ubuntu-24.04", "runs-on: ubuntu-24.04\n    timeout-minutes: soon", 1)
	linter, err := actionlint.NewLinter(io.Discard, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	errs, err := linter.Lint("ci.yml", []byte(broken), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) == 0 {
		t.Fatal("actionlint passed a workflow with a duplicated, non-numeric timeout-minutes")
	}
}
