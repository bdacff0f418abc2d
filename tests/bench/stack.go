package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/testenv"
)

// proc is one binary run as its own OS process, its output in a log file.
type proc struct {
	name   string
	bin    string
	env    []string
	ready  string
	log    string
	cmd    *exec.Cmd
	exited chan struct{}
}

func (p *proc) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args()...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	track(p)
	go func() {
		cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before it was ready (log: %s)", p.name, p.log)
		default:
		}
		if resp, err := client.Get(p.ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()
	return fmt.Errorf("%s not ready at %s (log: %s)", p.name, p.ready, p.log)
}

// args lets the bench binary run itself as the bare gin server or the
// naive checkout.
func (p *proc) args() []string {
	if p.name == "gin" || p.name == "naive" {
		return []string{p.name}
	}
	return nil
}

var (
	runningMu sync.Mutex
	running   = map[*proc]bool{}
	created   = map[string]bool{} // databases to drop on an interrupt
)

func track(p *proc) {
	runningMu.Lock()
	defer runningMu.Unlock()
	running[p] = true
}

// cleanUpOnSignal stops every process still running and drops the
// databases of the run when bench is interrupted (Ctrl-C), then exits.
func cleanUpOnSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ch
		fmt.Fprintln(os.Stderr, "bench: interrupted; stopping the processes")
		runningMu.Lock()
		ps := make([]*proc, 0, len(running))
		for p := range running {
			ps = append(ps, p)
		}
		dbs := make([]string, 0, len(created))
		for d := range created {
			dbs = append(dbs, d)
		}
		runningMu.Unlock()
		for _, p := range ps {
			p.stop()
		}
		for _, d := range dbs {
			dropDB(d)
		}
		os.Exit(130)
	}()
}

// stop sends SIGTERM and waits for the drain (SIGKILL after 25s).
func (p *proc) stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(25 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
	runningMu.Lock()
	delete(running, p)
	runningMu.Unlock()
}

// stack is the service as a user deploys it: the Stripe emulator, an SMTP
// sink, the api, the dispatcher and the worker, each its own process, on
// one database, a Redis key prefix and RabbitMQ names of their own.
type stack struct {
	dbURL     string
	stripeURL string // the stack's Stripe emulator
	names     rabbitmq.Names
	apiURL    string
	dispOps   string
	workOps   string
	procs     []*proc // in start order
	byName    map[string]*proc
}

// freeAddr is a port for one of the stack's processes; testenv.Port says
// why not one from Listen(":0").
func freeAddr() string {
	port, err := testenv.Port()
	if err != nil {
		panic(err)
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// startStack starts the stack's processes from the binaries in binDir (this
// build's, or -baseline's) on dbURL; extra is more environment of the api,
// the dispatcher and the worker (tracingPoint's OTLP endpoint).
func startStack(cfg *config, binDir, dbURL, id string, extra ...string) (*stack, error) {
	addr := map[string]string{}
	for _, n := range []string{"api", "emulator", "smtp", "sink", "dispatcher", "worker"} {
		addr[n] = freeAddr()
	}
	s := &stack{
		dbURL:     dbURL,
		stripeURL: "http://" + addr["emulator"],
		names:     rabbitmq.DefaultNames().WithPrefix("bench." + id + "."),
		apiURL:    "http://" + addr["api"],
		dispOps:   "http://" + addr["dispatcher"],
		workOps:   "http://" + addr["worker"],
		byName:    map[string]*proc{},
	}
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LOG_LEVEL=info", "SHUTDOWN_TIMEOUT=10s",
		"DATABASE_URL=" + dbURL, "AMQP_URL=" + cfg.amqpURL, "REDIS_URL=" + cfg.redisURL,
		"STRIPE_API_BASE=http://" + addr["emulator"],
		"AMQP_EXCHANGE=" + s.names.Exchange, "NOTIFY_QUEUE=" + s.names.NotifyQueue}
	env := func(kv ...string) []string { return append(append([]string{}, base...), kv...) }
	add := func(name, ready string, e []string) {
		p := &proc{name: name, bin: filepath.Join(binDir, name), env: e, ready: ready,
			log: filepath.Join(cfg.logDir, id+"-"+name+".log")}
		s.procs = append(s.procs, p)
		s.byName[name] = p
	}
	add("stripe-emulator", "http://"+addr["emulator"]+"/healthz",
		env("STRIPE_EMULATOR_ADDR="+addr["emulator"], "STRIPE_EMULATOR_WEBHOOK_URL=", "STRIPE_EMULATOR_SEARCH_LAG=0s"))
	add("smtp-sink", "http://"+addr["sink"]+"/messages",
		env("SMTP_SINK_ADDR="+addr["smtp"], "SMTP_SINK_HTTP_ADDR="+addr["sink"]))
	// RATE_LIMIT=0 (and its replay bucket): the load generator is one
	// tenant far above any sane per-tenant limit; the limit is not what is
	// measured.
	add("api", s.apiURL+"/readyz", env(append([]string{"HTTP_ADDR=" + addr["api"], "REDIS_KEY_PREFIX=bench:" + id + ":", "RATE_LIMIT=0", "RATE_LIMIT_REPLAY=0"}, extra...)...))
	add("dispatcher", s.dispOps+"/readyz", env(append([]string{"METRICS_ADDR=" + addr["dispatcher"]}, extra...)...))
	add("worker", s.workOps+"/readyz", env(append([]string{"METRICS_ADDR=" + addr["worker"], "SMTP_ADDR=" + addr["smtp"]}, extra...)...))
	for _, p := range s.procs {
		if err := p.start(); err != nil {
			s.stop()
			return nil, err
		}
	}
	return s, nil
}

func (s *stack) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if conn, err := amqp.Dial(benchCfg.amqpURL); err == nil {
		if ch, err := conn.Channel(); err == nil {
			rabbitmq.DeleteTopology(ch, s.names)
		}
		conn.Close()
	}
	_ = ctx
}

// scrapeClient asks for the page uncompressed: drain scrapes every 20ms
// while the relay is timed, and gzip on both ends took CPU from the
// processes measured.
var scrapeClient = &http.Client{Transport: &http.Transport{DisableCompression: true}, Timeout: 10 * time.Second}

// metrics returns the samples of a Prometheus text page whose name starts
// with prefix, keyed by the whole series ("name{labels}").
func metrics(url, prefix string) (map[string]float64, error) {
	resp, err := scrapeClient.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	// Grown only for a long line: drain polls this every 20ms while the
	// relay is timed, and a 1 MiB buffer a poll (as it was) took CPU from
	// the processes measured.
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

func metric(url, name string) float64 {
	m, err := metrics(url, name)
	if err != nil {
		return -1
	}
	return m[name]
}

// createDB creates an empty database and returns its URL.
func createDB(ctx context.Context, name string) (string, error) {
	admin, err := pgx.Connect(ctx, benchCfg.pgAdmin)
	if err != nil {
		return "", err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	if !strings.HasPrefix(name, "bench_large_") {
		runningMu.Lock()
		created[name] = true
		runningMu.Unlock()
	}
	return dbURL(name), nil
}

func dropDB(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, benchCfg.pgAdmin)
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

func dbURL(name string) string {
	u := benchCfg.pgAdmin
	i := strings.LastIndex(u, "/")
	q := ""
	if j := strings.IndexByte(u[i:], '?'); j >= 0 {
		q = u[i+j:]
	}
	return u[:i] + "/" + name + q
}

func execSQL(ctx context.Context, url string, stmts ...string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("%.80s: %w", s, err)
		}
	}
	return nil
}
