package pgtest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/onceonly/checkout/internal/testenv"
)

// BinDir is where the PostgreSQL server binaries (initdb, postgres,
// pg_basebackup, pg_ctl) are: $PG_BIN, or Debian's PostgreSQL 15.
func BinDir() string {
	if d := os.Getenv("PG_BIN"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	// Async makes the standby asynchronous: the primary commits without
	// waiting for it, so a commit acknowledged just before the primary dies
	// may be missing on the standby. The default is synchronous
	// (synchronous_standby_names names the standby, synchronous_commit=on):
	// a commit returns once the standby has flushed its WAL.
	Async bool
	// ReplicationLatency delays the WAL the primary streams to the
	// standby (a toxiproxy link between them; 0: none). With an
	// asynchronous standby it opens a window of that length in which a
	// commit the primary acknowledged is not on the standby yet; a
	// synchronous standby makes each commit wait for it instead.
	ReplicationLatency time.Duration
}

// Cluster is a PostgreSQL primary and a streaming-replication standby, each
// a server of its own on a free port with its data directory under the
// test's temporary directory, both stopped in the test's cleanup.
type Cluster struct {
	Primary, Standby *Server
}

// Server is one PostgreSQL server of a Cluster, run as a child process in a
// process group of its own (postmaster and backends), so that Kill takes the
// whole server down at once, as a dead machine would.
type Server struct {
	// Name is "primary" or "standby" (the standby's application_name).
	Name string
	// Port is its TCP port on 127.0.0.1.
	Port int
	// DataDir is its data directory.
	DataDir string

	t       testing.TB
	args    []string
	logPath string

	mu   sync.Mutex
	proc *testenv.Proc
}

// StartCluster initializes a primary (initdb, trust authentication), takes a
// base backup of it for the standby (pg_basebackup -R), starts both and
// waits until the standby streams, and, when synchronous, until the primary
// reports it as its synchronous standby. It fails the test when the
// binaries are missing.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if _, err := os.Stat(filepath.Join(BinDir(), "initdb")); err != nil {
		t.Fatalf("pgtest: PostgreSQL server binaries not found in %s (set PG_BIN): %v", BinDir(), err)
	}
	base := t.TempDir()
	// PostgreSQL refuses to run as root: as root the servers run as the
	// postgres user, which needs to reach and own the directories.
	cred := serverCredential(t)
	if cred != nil {
		for _, d := range []string{filepath.Dir(base), base} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatalf("pgtest: %v", err)
			}
		}
		if err := os.Chown(base, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}

	c := &Cluster{
		Primary: &Server{Name: "primary", Port: testenv.FreePort(t), DataDir: filepath.Join(base, "primary"), t: t},
		Standby: &Server{Name: "standby", Port: testenv.FreePort(t), DataDir: filepath.Join(base, "standby"), t: t},
	}
	runTool(t, cred, "initdb", "-D", c.Primary.DataDir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")

	common := []string{
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "max_connections=300",
		"-c", "shared_buffers=32MB",
		"-c", "max_wal_senders=5",
		"-c", "hot_standby=on",
		"-c", "wal_level=replica",
		// Durability against a killed process does not need fsync: the
		// page cache outlives the server. It makes the test fast on a
		// small machine.
		"-c", "fsync=off",
		"-c", "synchronous_commit=on",
		"-c", "log_min_messages=warning",
	}
	primaryArgs := append([]string{"-D", c.Primary.DataDir, "-c", "port=" + strconv.Itoa(c.Primary.Port)}, common...)
	if !opts.Async {
		primaryArgs = append(primaryArgs, "-c", "synchronous_standby_names=standby")
	}
	c.Primary.args = primaryArgs
	c.Primary.logPath = filepath.Join(base, "primary.log")
	c.Primary.start(cred)

	runTool(t, cred, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.Primary.Port), "-U", "postgres",
		"-D", c.Standby.DataDir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	upstream := c.Primary.Port
	if opts.ReplicationLatency > 0 {
		upstream = replicationLink(t, c.Primary.Addr(), opts.ReplicationLatency)
	}
	c.Standby.args = append([]string{"-D", c.Standby.DataDir, "-c", "port=" + strconv.Itoa(c.Standby.Port),
		"-c", fmt.Sprintf("primary_conninfo=host=127.0.0.1 port=%d user=postgres application_name=standby", upstream)},
		common...)
	c.Standby.logPath = filepath.Join(base, "standby.log")
	c.Standby.start(cred)

	// Streaming, and (when synchronous) the standby the primary waits for.
	want := "async"
	if !opts.Async {
		want = "sync"
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var state string
		err := c.Primary.queryRow(`SELECT coalesce((SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming'), '')`, &state)
		if err == nil && state == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: standby not streaming as %s after 60s (state %q, err %v)\nprimary log:\n%s\nstandby log:\n%s",
				want, state, err, tail(c.Primary.logPath), tail(c.Standby.logPath))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c
}

// replicationLink starts a toxiproxy link to primary that delays what the
// primary sends by latency, and returns its port.
func replicationLink(t testing.TB, primary string, latency time.Duration) int {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.New(io.Discard))
	port := testenv.FreePort(t)
	p := toxiproxy.NewProxy(srv, "replication", "127.0.0.1:"+strconv.Itoa(port), primary)
	if err := srv.Collection.Add(p, true); err != nil {
		t.Fatalf("pgtest: replication link: %v", err)
	}
	t.Cleanup(func() { _ = srv.Collection.Clear() })
	body := fmt.Sprintf(`{"name":"wal_latency","stream":"downstream","type":"latency","toxicity":1,"attributes":{"latency":%d}}`, latency.Milliseconds())
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		t.Fatalf("pgtest: replication latency: %v", err)
	}
	return port
}

// URL returns a libpq multi-host URL of database db naming the primary and
// then the standby, with target_session_attrs=read-write: a client connects
// to whichever of them accepts writes, the standby once it is promoted.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		c.Primary.Port, c.Standby.Port, db)
}

// Hosts returns the servers' host:port, primary first.
func (c *Cluster) Hosts() []string {
	return []string{c.Primary.Addr(), c.Standby.Addr()}
}

// Promote turns the standby into a primary (pg_ctl promote, waiting until
// it accepts writes) and returns how long that took.
func (c *Cluster) Promote() (time.Duration, error) {
	start := time.Now()
	cmd := exec.Command(filepath.Join(BinDir(), "pg_ctl"), "promote", "-w", "-t", "60", "-D", c.Standby.DataDir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: serverCredential(c.Standby.t)}
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("pg_ctl promote: %w\n%s", err, out)
	}
	return time.Since(start), nil
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns the URL of database db on this server alone.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.Addr(), db)
}

// Kill sends SIGKILL to the server's process group, the postmaster and
// every backend at once, and waits until the postmaster is gone. Nothing is
// shut down cleanly: no checkpoint, and connections are reset.
func (s *Server) Kill() {
	s.mu.Lock()
	proc := s.proc
	s.proc = nil
	s.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
}

// Log returns the last lines of the server's log.
func (s *Server) Log() string { return tail(s.logPath) }

func (s *Server) start(cred *syscall.Credential) {
	t := s.t
	t.Helper()
	cmd := exec.Command(filepath.Join(BinDir(), "postgres"), s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	proc, err := testenv.StartProc(cmd, s.logPath)
	if err != nil {
		t.Fatalf("pgtest: start %s: %v", s.Name, err)
	}
	s.mu.Lock()
	s.proc = proc
	s.mu.Unlock()
	t.Cleanup(s.Kill)

	deadline := time.Now().Add(60 * time.Second)
	for {
		var one int
		err := s.queryRow(`SELECT 1`, &one)
		if err == nil {
			return
		}
		select {
		case <-proc.Exited():
			t.Fatalf("pgtest: %s exited at start:\n%s", s.Name, tail(s.logPath))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: %s not answering after 60s: %v\n%s", s.Name, err, tail(s.logPath))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) queryRow(sql string, dst ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dst...)
}

// serverCredential is the postgres user's when the test runs as root
// (initdb, postgres and pgbouncer refuse root), else nil: the current user.
func serverCredential(t TB) *syscall.Credential {
	cred, err := credential()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return cred
}

func credential() (*syscall.Credential, error) {
	if os.Getuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user to run the servers as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// runTool runs one of the PostgreSQL binaries to completion.
func runTool(t testing.TB, cred *syscall.Credential, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(BinDir(), name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}
