package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/onceonly/checkout/internal/testenv"
)

// TB is the part of testing.TB the servers need; *testing.T satisfies it,
// and so does the e2e stack's TB.
type TB interface {
	Helper()
	Cleanup(func())
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// PgBouncerBin is the pgbouncer binary: $PGBOUNCER, or Debian's.
func PgBouncerBin() string {
	if b := os.Getenv("PGBOUNCER"); b != "" {
		return b
	}
	return "/usr/sbin/pgbouncer"
}

// PgBouncer is a pgbouncer process in transaction pooling in front of one
// PostgreSQL server, on a free port, stopped in the test's cleanup.
type PgBouncer struct {
	// Addr is its host:port; any database of the server is reached by its
	// name, as user postgres (trust).
	Addr string
	// PoolSize is default_pool_size: server connections per database.
	PoolSize int
}

// PgBouncerOptions tune StartPgBouncer.
type PgBouncerOptions struct {
	// PoolSize is default_pool_size (default 20).
	PoolSize int
}

// StartPgBouncer starts pgbouncer (pool_mode=transaction, trust
// authentication as user postgres) in front of upstream (host:port), and
// waits until it accepts connections. It returns an error when the binary
// is missing (scripts/services.sh installs it) or it does not start.
func StartPgBouncer(t TB, upstream string, opts ...PgBouncerOptions) (*PgBouncer, error) {
	t.Helper()
	o := PgBouncerOptions{PoolSize: 20}
	if len(opts) > 0 && opts[0].PoolSize > 0 {
		o.PoolSize = opts[0].PoolSize
	}
	if _, err := os.Stat(PgBouncerBin()); err != nil {
		return nil, fmt.Errorf("pgbouncer not installed (scripts/services.sh installs it): %w", err)
	}
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		// pgbouncer refuses to run as root: it runs as postgres, which
		// reads its files and writes its log here.
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	listen, err := testenv.Port()
	if err != nil {
		return nil, err
	}

	b := &PgBouncer{Addr: "127.0.0.1:" + strconv.Itoa(listen), PoolSize: o.PoolSize}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
logfile = %s
log_connections = 0
log_disconnections = 0
`, host, port, listen, filepath.Join(dir, "userlist.txt"), b.PoolSize, filepath.Join(dir, "pgbouncer.log"))
	for name, content := range map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"postgres" ""` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(PgBouncerBin(), filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	outPath := filepath.Join(dir, "stdout.log")
	proc, err := testenv.StartProc(cmd, outPath)
	if err != nil {
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	t.Cleanup(proc.Kill)
	out := func() string { b, _ := os.ReadFile(outPath); return string(b) }
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr, time.Second)
		if err == nil {
			c.Close()
			return b, nil
		}
		select {
		case <-proc.Exited():
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			return nil, fmt.Errorf("pgbouncer exited at start: %s\n%s", out(), log)
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("pgbouncer not listening on %s after 20s: %s", b.Addr, out())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
