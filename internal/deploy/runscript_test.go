package deploy_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
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

// runPlan runs `scripts/run.sh --plan`, which starts nothing, with only the
// given variables and PATH and HOME set, and returns the addresses each
// process would listen on (by variable, e.g. api's HTTP_ADDR) and the demo
// line.
func runPlan(t *testing.T, vars ...string) (listen map[string]string, demo string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "scripts", "run.sh"), "--plan")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, vars...)
	out, err := cmd.Output()
	require.NoError(t, err)
	listen = map[string]string{}
	addr := regexp.MustCompile(`\b((?:HTTP|METRICS|STRIPE_EMULATOR|SMTP_SINK|SMTP_SINK_HTTP|STOREFRONT)_ADDR)=(\S+)`)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		rest, ok := strings.CutPrefix(line, "[plan] ")
		require.True(t, ok, line)
		name, rest, _ := strings.Cut(rest, ": ")
		if name == "demo" {
			demo = rest
			continue
		}
		// The process's own addresses come after the shared environment.
		for _, m := range addr.FindAllStringSubmatch(rest, -1) {
			listen[name+" "+m[1]] = m[2]
		}
	}
	require.Len(t, listen, 7, "the six processes' addresses: %s", out)
	return listen, demo
}

// TestRunScriptListensOnLoopback (issue 36): make run's processes listen on
// 127.0.0.1 unless CHECKOUT_HOST_IP says otherwise: the api takes the
// development keys and the emulator faults from anyone who reaches them.
func TestRunScriptListensOnLoopback(t *testing.T) {
	t.Parallel()
	listen, _ := runPlan(t)
	require.NoError(t, listensOn(listen, "127.0.0.1"))
	wide, _ := runPlan(t, "CHECKOUT_HOST_IP=0.0.0.0")
	require.ErrorContains(t, listensOn(wide, "127.0.0.1"), "api HTTP_ADDR=0.0.0.0:8080")

	// The check itself: make run of issue 36, the api on ":8080".
	require.ErrorContains(t, listensOn(map[string]string{"api HTTP_ADDR": ":8080"}, "127.0.0.1"), "api HTTP_ADDR=:8080")
}

// listensOn reports an address not on host, the SMTP sink's SMTP side
// aside (on loopback always: only the worker sends to it).
func listensOn(listen map[string]string, host string) error {
	var errs []string
	for k, v := range listen {
		if h, _, _ := strings.Cut(v, ":"); h != host && k != "smtp-sink SMTP_SINK_ADDR" {
			errs = append(errs, fmt.Sprintf("%s=%s", k, v))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("not on %s: %s", host, strings.Join(errs, ", "))
	}
	return nil
}

// TestRunScriptDemoLineCarriesTheStack (issue 36): the `make demo` line
// make run prints for another terminal, which has none of its environment,
// carries the stack's addresses when they are not the demo's defaults and
// the database the stack uses: without DATABASE_URL the demo of a stack of
// one's own names read the outbox of the database checkout.
func TestRunScriptDemoLineCarriesTheStack(t *testing.T) {
	t.Parallel()
	_, demo := runPlan(t)
	require.Equal(t, "make demo", demo)

	_, demo = runPlan(t, "DATABASE_URL=postgres://postgres@127.0.0.1:5432/mine?sslmode=disable", "PGPASSWORD=it's",
		"PORT_OFFSET=20000", "REDIS_KEY_PREFIX=mine:")
	require.Equal(t, "API=http://127.0.0.1:28080 SINK=http://127.0.0.1:28025 EMU=http://127.0.0.1:32111 "+
		`DATABASE_URL='postgres://postgres@127.0.0.1:5432/mine?sslmode=disable' PGPASSWORD='it'\''s' make demo`, demo)

	_, demo = runPlan(t, "CHECKOUT_HOST_IP=192.0.2.7")
	require.Equal(t, "API=http://192.0.2.7:8080 SINK=http://192.0.2.7:8025 EMU=http://192.0.2.7:12111 make demo", demo)
}
