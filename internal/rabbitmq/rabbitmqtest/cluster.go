package rabbitmqtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/checkout/internal/testenv"
)

// The RabbitMQ scripts themselves: /usr/sbin/rabbitmq-server is Debian's
// wrapper, which switches to the rabbitmq user (and its HOME, hence the
// system node's Erlang cookie) when run as root.
var (
	serverBin = firstExisting("/usr/lib/rabbitmq/bin/rabbitmq-server", "rabbitmq-server")
	ctlBin    = firstExisting("/usr/lib/rabbitmq/bin/rabbitmqctl", "rabbitmqctl")
)

func firstExisting(paths ...string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return paths[len(paths)-1]
}

// Cluster is a RabbitMQ cluster of rabbitmq-server processes a test owns,
// on this machine: each node with its own name, AMQP and distribution
// ports, data and log directories under t.TempDir(), no plugins, and the
// cluster's own Erlang cookie. The machine's RabbitMQ is not touched
// (only epmd, which every Erlang node on the machine shares).
type Cluster struct {
	Nodes []*Node

	dir  string
	home string // HOME, holding the cluster's .erlang.cookie
}

// Node is one rabbitmq-server of a Cluster.
type Node struct {
	// Name is the Erlang node name, e.g. "rmq3f2a1-1@localhost".
	Name string
	// Port is the AMQP port on 127.0.0.1.
	Port int
	// URL is the node's AMQP URL with the guest account.
	URL string

	c    *Cluster
	env  []string
	log  string
	mu   sync.Mutex
	proc *testenv.Proc
}

// StartCluster starts n nodes (at once), joins nodes 2..n to node 1
// (rabbitmqctl stop_app, join_cluster, start_app) and waits until every
// node runs. The nodes are killed in t.Cleanup. Booting a node takes
// seconds to a minute on a loaded machine; allow minutes in all.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if _, err := exec.LookPath(serverBin); err != nil {
		t.Skipf("rabbitmqtest: rabbitmq-server not installed: %v", err)
	}
	dir := t.TempDir()
	c := &Cluster{dir: dir, home: filepath.Join(dir, "home")}
	must(t, os.MkdirAll(c.home, 0o700))
	must(t, os.WriteFile(filepath.Join(c.home, ".erlang.cookie"), []byte(cookie()), 0o400))
	must(t, os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644))
	// An empty rabbitmq-env.conf of the cluster's own: the machine's
	// /etc/rabbitmq/rabbitmq-env.conf sets NODENAME.
	must(t, os.WriteFile(filepath.Join(dir, "rabbitmq-env.conf"), nil, 0o644))

	id := strings.ToLower(cookie()[:6])
	for i := range n {
		nd := filepath.Join(dir, "node"+strconv.Itoa(i+1))
		must(t, os.MkdirAll(nd, 0o755))
		port, dist := testenv.FreePort(t), testenv.FreePort(t)
		conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", port)
		must(t, os.WriteFile(filepath.Join(nd, "rabbitmq.conf"), []byte(conf), 0o644))
		node := &Node{
			Name: fmt.Sprintf("rmq%s-%d@localhost", id, i+1),
			Port: port,
			URL:  fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port),
			c:    c,
			log:  filepath.Join(nd, "stdout.log"),
		}
		node.env = append(c.baseEnv(),
			"RABBITMQ_NODENAME="+node.Name,
			"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
			"RABBITMQ_NODE_PORT="+strconv.Itoa(port),
			"RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
			"RABBITMQ_MNESIA_BASE="+filepath.Join(nd, "mnesia"),
			"RABBITMQ_LOG_BASE="+filepath.Join(nd, "log"),
			"RABBITMQ_CONFIG_FILE="+filepath.Join(nd, "rabbitmq.conf"),
			"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(nd, "advanced.config"),
			"RABBITMQ_PID_FILE="+filepath.Join(nd, "pid"),
			"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		)
		c.Nodes = append(c.Nodes, node)
	}
	// Registered after t.TempDir, so run before its removal.
	t.Cleanup(func() {
		for _, nd := range c.Nodes {
			nd.Kill()
		}
		if t.Failed() {
			for _, nd := range c.Nodes {
				t.Logf("rabbitmqtest: %s log tail:\n%s", nd.Name, tail(nd.logFile(), 30))
			}
		}
	})
	for _, nd := range c.Nodes {
		must(t, nd.start())
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	// The nodes boot at once (the slow part), but join one at a time: two
	// nodes joining the first at once can make mnesia refuse the second's
	// start_app ({:mnesia_app, :start, ...}; seen once in CI). A join that
	// fails anyway is tried again from a reset node.
	var joining sync.Mutex
	for i, nd := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = nd.awaitStartup(3 * time.Minute); errs[i] != nil || i == 0 {
				return
			}
			joining.Lock()
			defer joining.Unlock()
			for try := range 3 {
				steps := [][]string{{"stop_app"}, {"join_cluster", c.Nodes[0].Name}, {"start_app"}}
				if try > 0 {
					steps = [][]string{{"stop_app"}, {"reset"}, {"join_cluster", c.Nodes[0].Name}, {"start_app"}}
				}
				for _, args := range steps {
					if _, errs[i] = nd.Ctl(2*time.Minute, args...); errs[i] != nil {
						break
					}
				}
				if errs[i] == nil {
					return
				}
				t.Logf("rabbitmqtest: %s joining %s, try %d: %v", nd.Name, c.Nodes[0].Name, try+1, errs[i])
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		must(t, err)
	}
	if _, err := c.Nodes[0].Ctl(2*time.Minute, "await_online_nodes", strconv.Itoa(n), "--timeout", "120"); err != nil {
		t.Fatalf("rabbitmqtest: cluster of %d: %v", n, err)
	}
	return c
}

// URL is the comma-separated list of the nodes' URLs, as AMQP_URL takes it.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL
	}
	return strings.Join(urls, ",")
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Running returns the nodes whose process runs.
func (c *Cluster) Running() []*Node {
	var out []*Node
	for _, n := range c.Nodes {
		if n.IsRunning() {
			out = append(out, n)
		}
	}
	return out
}

// QueueLeader returns the node that leads quorum queue name, or the node
// a classic queue lives on, asking a running node.
func (c *Cluster) QueueLeader(name string) (*Node, error) {
	run := c.Running()
	if len(run) == 0 {
		return nil, fmt.Errorf("no node runs")
	}
	out, err := run[0].Ctl(time.Minute, "list_queues", "name", "leader", "--formatter", "json", "--quiet")
	if err != nil {
		return nil, err
	}
	var qs []struct {
		Name   string `json:"name"`
		Leader string `json:"leader"`
	}
	if err := json.Unmarshal([]byte(jsonPart(out)), &qs); err != nil {
		return nil, fmt.Errorf("list_queues: %w: %s", err, out)
	}
	for _, q := range qs {
		if q.Name == name {
			if q.Leader == "" { // a classic queue: the node that lists it as local
				return c.localNode(name)
			}
			if n := c.Node(q.Leader); n != nil {
				return n, nil
			}
			return nil, fmt.Errorf("queue %s: leader %q is not a node of the cluster", name, q.Leader)
		}
	}
	return nil, fmt.Errorf("queue %s not found: %s", name, out)
}

// localNode returns the running node on which queue name lives, for a
// classic queue (which has no leader): the one whose list_queues --local
// shows it.
func (c *Cluster) localNode(name string) (*Node, error) {
	for _, n := range c.Running() {
		out, err := n.Ctl(time.Minute, "list_queues", "name", "--local", "--formatter", "json", "--quiet")
		if err != nil {
			return nil, err
		}
		var qs []struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal([]byte(jsonPart(out)), &qs); err != nil {
			return nil, fmt.Errorf("list_queues --local: %w: %s", err, out)
		}
		for _, q := range qs {
			if q.Name == name {
				return n, nil
			}
		}
	}
	return nil, fmt.Errorf("queue %s: on no running node", name)
}

// AwaitOnline waits until n nodes of the cluster run and are clustered.
func (c *Cluster) AwaitOnline(n int, timeout time.Duration) error {
	run := c.Running()
	if len(run) == 0 {
		return fmt.Errorf("no node runs")
	}
	secs := strconv.Itoa(int(timeout.Seconds()))
	_, err := run[0].Ctl(timeout+30*time.Second, "await_online_nodes", strconv.Itoa(n), "--timeout", secs)
	return err
}

func (c *Cluster) baseEnv() []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + c.home,
		"LANG=C.UTF-8", "LC_ALL=C.UTF-8",
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(c.dir, "rabbitmq-env.conf"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	}
}

// start runs rabbitmq-server in a process group of its own, so that Kill
// reaches the Erlang VM under the script.
func (n *Node) start() error {
	cmd := exec.Command(serverBin)
	cmd.Env = n.env
	cmd.Dir = n.c.dir
	proc, err := testenv.StartProc(cmd, n.log)
	if err != nil {
		return fmt.Errorf("rabbitmqtest: start %s: %w", n.Name, err)
	}
	n.mu.Lock()
	n.proc = proc
	n.mu.Unlock()
	return nil
}

// Kill kills the node's process group with SIGKILL (a crash: no goodbye to
// the cluster or the clients, whose connections the kernel resets) and
// waits for it. Killing a stopped node does nothing.
func (n *Node) Kill() {
	n.mu.Lock()
	proc := n.proc
	n.proc = nil
	n.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
}

// IsRunning reports whether the node's process runs (it may still boot).
func (n *Node) IsRunning() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil && n.proc.Running()
}

// Restart starts a killed node again, with its name and data: it rejoins
// its cluster by itself. It returns once the node has booted.
func (n *Node) Restart(timeout time.Duration) error {
	n.Kill()
	if err := n.start(); err != nil {
		return err
	}
	return n.awaitStartup(timeout)
}

// awaitStartup waits until the node has booted (rabbitmqctl await_startup),
// or its process exits.
func (n *Node) awaitStartup(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	// await_startup needs the node's Erlang distribution up: before that it
	// fails at once, so retry it until the deadline.
	for {
		_, err := n.Ctl(timeout, "await_startup", "--timeout", strconv.Itoa(int(time.Until(deadline).Seconds())+1))
		if err == nil {
			return nil
		}
		if !n.IsRunning() {
			return fmt.Errorf("rabbitmqtest: %s exited while booting:\n%s", n.Name, tail(n.logFile(), 30))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rabbitmqtest: %s not booted after %s: %w", n.Name, timeout, err)
		}
		time.Sleep(time.Second)
	}
}

// Ctl runs rabbitmqctl against the node and returns its output.
func (n *Node) Ctl(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, ctlBin, append([]string{"-n", n.Name}, args...)...)
	cmd.Env = n.c.baseEnv()
	cmd.Dir = n.c.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("rabbitmqctl -n %s %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// logFile is the node's RabbitMQ log, or its stdout before that exists.
func (n *Node) logFile() string {
	l := filepath.Join(filepath.Dir(n.log), "log", n.Name+".log")
	if _, err := os.Stat(l); err == nil {
		return l
	}
	return n.log
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// jsonPart drops what rabbitmqctl may print before its JSON (warnings).
func jsonPart(out string) string {
	if i := strings.IndexAny(out, "[{"); i >= 0 {
		return out[i:]
	}
	return out
}

// cookie returns a random Erlang cookie: 20 upper-case letters.
func cookie() string {
	b := make([]byte, 20)
	for i := range b {
		v, err := rand.Int(rand.Reader, big.NewInt(26))
		if err != nil {
			panic(err)
		}
		b[i] = byte('A' + v.Int64())
	}
	return string(b)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("rabbitmqtest: %v", err)
	}
}
