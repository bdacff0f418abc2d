package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBaselinePatchesApplyAndBuild keeps the README's A/B figures
// reproducible from a clone: every bench/*.patch (the baselines
// scripts/bench.sh builds with BASELINE_PATCH) must still apply to this
// tree and compile. It patches copies of the files the patch names and
// builds their packages with `go build -overlay`, so the tree is untouched.
func TestBaselinePatchesApplyAndBuild(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	patches, err := filepath.Glob(filepath.Join(root, "bench", "*.patch"))
	if err != nil {
		t.Fatal(err)
	}
	if len(patches) == 0 {
		t.Fatal("no bench/*.patch: the README's fast-path A/B needs bench/fastpath-off.patch")
	}
	for _, patch := range patches {
		t.Run(filepath.Base(patch), func(t *testing.T) {
			diff, err := os.ReadFile(patch)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			files := gitApply(t, dir, diff, "--numstat")
			if len(files) == 0 {
				t.Fatalf("%s changes no file", patch)
			}
			overlay := map[string]string{}
			pkgs := map[string]bool{}
			for _, f := range files {
				src, err := os.ReadFile(filepath.Join(root, f))
				if err != nil {
					t.Fatalf("%s names %s: %v", patch, f, err)
				}
				copyPath := filepath.Join(dir, f)
				if err := os.MkdirAll(filepath.Dir(copyPath), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(copyPath, src, 0o644); err != nil {
					t.Fatal(err)
				}
				overlay[filepath.Join(root, f)] = copyPath
				pkgs["./"+filepath.Dir(f)] = true
			}
			gitApply(t, dir, diff)
			for f, copyPath := range overlay {
				before, _ := os.ReadFile(f)
				after, _ := os.ReadFile(copyPath)
				if bytes.Equal(before, after) {
					t.Fatalf("%s left %s as it was", patch, f)
				}
			}
			ov, err := json.Marshal(map[string]any{"Replace": overlay})
			if err != nil {
				t.Fatal(err)
			}
			ovPath := filepath.Join(dir, "overlay.json")
			if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"build", "-overlay", ovPath, "-o", os.DevNull}
			for p := range pkgs {
				args = append(args, p)
			}
			build := exec.Command("go", args...)
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("%s does not build: %v\n%s", patch, err, out)
			}
		})
	}
}

// gitApply runs `git apply args...` in dir on diff, outside any repository
// (as scripts/bench.sh does), and returns the paths of --numstat's lines.
func gitApply(t *testing.T, dir string, diff []byte, args ...string) []string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"apply"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(dir))
	cmd.Stdin = bytes.NewReader(diff)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("git apply %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	var paths []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if fields := strings.Split(sc.Text(), "\t"); len(fields) == 3 {
			paths = append(paths, fields[2])
		}
	}
	return paths
}
