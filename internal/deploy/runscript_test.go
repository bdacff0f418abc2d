package deploy_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestConfigVarsFindEveryEnvTag: scripts/config-vars.sh, which tells
// make run's restart command what to carry, lists every variable a
// settings struct reads (an `env:"X"` tag in cmd/ or internal/). When a
// tag was missed (AMQP_EXCHANGE and NOTIFY_QUEUE, once their struct moved
// into internal/config), a worker restarted by hand consumed another
// queue and a dispatcher published every event where no worker of the
// stack read it: emails lost.
func TestConfigVarsFindEveryEnvTag(t *testing.T) {
	out, err := exec.Command(filepath.Join(root, "scripts", "config-vars.sh")).Output()
	require.NoError(t, err)
	listed := map[string]bool{}
	for _, v := range strings.Fields(string(out)) {
		listed[v] = true
	}

	tags := map[string]string{} // variable -> where
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testenv" || d.Name() == "pgtest" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				field, ok := n.(*ast.Field)
				if !ok || field.Tag == nil {
					return true
				}
				tag, err := strconv.Unquote(field.Tag.Value)
				if err != nil {
					return true
				}
				if name, _, _ := strings.Cut(reflect.StructTag(tag).Get("env"), ","); name != "" {
					tags[name] = path
				}
				return true
			})
			return nil
		})
		require.NoError(t, err)
	}
	require.NotEmpty(t, tags)
	for name, where := range tags {
		require.True(t, listed[name], "scripts/config-vars.sh does not list %s (an env tag in %s)", name, where)
	}
}
