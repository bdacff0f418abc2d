// Package stack runs the whole checkout service as real processes for
// end-to-end and chaos tests: the Stripe emulator, the SMTP sink, the api,
// the dispatcher and the worker, each on free ports, with its own database,
// Redis key prefix and RabbitMQ names, every dependency link going through a
// toxiproxy proxy, and a gateway that answers 504 like a load balancer.
//
// It reads the exact counts the service's guarantees are stated in: the
// PaymentIntents created per Stripe idempotency key, the orders and keys in
// Postgres, the emails per order at the sink, the unpublished outbox rows.
package stack

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/internal/testenv"
)

// TB is the part of testing.TB the stack needs; *testing.T satisfies it,
// and so can a plain program (tests/chaos).
type TB interface {
	Helper()
	Cleanup(func())
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Failed() bool
}

// Binaries are the commands a stack runs, built by Build.
var Binaries = []string{"api", "dispatcher", "worker", "stripe-emulator", "smtp-sink", "migrate"}

// ModuleRoot returns the directory of the checkout module's go.mod, found
// from the working directory upwards: the first go.mod beside a cmd/api
// (whatever the module path, which a fork made by gonew changes).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		_, errMod := os.Stat(filepath.Join(dir, "go.mod"))
		_, errAPI := os.Stat(filepath.Join(dir, "cmd", "api", "main.go"))
		if errMod == nil && errAPI == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod of the checkout module (with cmd/api) not found above the working directory")
		}
		dir = parent
	}
}

// Build compiles the Binaries into dir with `go build`. Call it once per
// test binary (TestMain): the machine is small and every stack shares them.
func Build(dir string) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, b := range Binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// Main is a TestMain for a package of stack tests: it builds the Binaries
// once into a temporary folder named after prefix, sets *binDir to it, runs
// m, removes the folder and exits with m's code. A build that fails exits 1
// with the compiler's output on stderr, before any test runs.
func Main(m interface{ Run() int }, prefix string, binDir *string) {
	dir, err := os.MkdirTemp("", prefix+"-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	*binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Options configure a Stack. Zero values are the service's defaults, except
// where noted.
type Options struct {
	// BinDir holds the binaries (Build). Required.
	BinDir string
	// Lease and TTL are IDEMPOTENCY_LEASE and IDEMPOTENCY_TTL.
	Lease, TTL time.Duration
	// StripeTimeout and StripeMaxElapsed are STRIPE_TIMEOUT and
	// STRIPE_MAX_ELAPSED.
	StripeTimeout, StripeMaxElapsed time.Duration
	// SearchLag is the emulator's STRIPE_EMULATOR_SEARCH_LAG and the api's
	// and worker's STRIPE_SEARCH_SETTLE (default 300ms: the saga trusts a
	// search only once the index has caught up).
	SearchLag time.Duration
	// DedupFailureMode is DEDUP_FAILURE_MODE ("closed" by default).
	DedupFailureMode string
	// RedisAddr is the Redis the api's proxy forwards to; empty means the
	// shared Redis (under a key prefix of the stack's own). A test that
	// kills or flushes Redis passes a server of its own (testenv.StartRedis).
	RedisAddr string
	// AMQPURL, when set, is the dispatcher's and the worker's AMQP_URL,
	// used as it is (no proxy): e.g. a RabbitMQ cluster's nodes
	// (rabbitmqtest.StartCluster). Empty: the shared broker, each process
	// through a proxy of its own (AMQPDispatcher, AMQPWorker).
	AMQPURL string
	// GatewayTimeout is how long the gateway waits for the api before it
	// answers 504 (default 5s).
	GatewayTimeout time.Duration
	// Webhooks makes the emulator deliver its signed webhooks to the api's
	// POST /v1/webhooks/stripe (STRIPE_EMULATOR_WEBHOOK_URL; same default
	// STRIPE_WEBHOOK_SECRET on both sides). Off: the emulator sends none.
	Webhooks bool
	// NoBackground leaves the dispatcher and the worker stopped.
	NoBackground bool
	// Env adds or overrides variables per process name ("api", "worker",
	// ...), e.g. for a setting a scenario needs.
	Env map[string]map[string]string
	// LogDir receives one log file per process (default: a temporary
	// directory removed at the end).
	LogDir string
	// PostgresURL, when set, is the PostgreSQL the stack uses instead of
	// the shared server: a URL of its "postgres" database, which may name
	// several hosts (pgtest.Cluster.URL). The stack's database is created
	// there, and every process connects to it directly (not through the PG
	// proxies) with a DATABASE_URL naming the same hosts and parameters.
	PostgresURL string
	// PgBouncer puts a PgBouncer in transaction pooling
	// (pgtest.StartPgBouncer) between the PG proxies and PostgreSQL, as a
	// deployment behind a pooler has: every process's DATABASE_URL carries
	// PgBouncerParams, and the api does not migrate (MIGRATE_ON_START=false)
	// as the stack runs migrate on a direct connection first. The
	// environment variable E2E_PGBOUNCER=1 turns it on for every stack.
	PgBouncer bool
}

// PgBouncerParams are the DATABASE_URL query parameters the processes need
// behind PgBouncer in transaction pooling (docs/operations.md, "PgBouncer"): pgx's
// default mode prepares named statements on one server connection and
// executes them later on whichever the pooler hands out, where they do not
// exist; cache_describe sends each statement unnamed, parse to execute in
// one round trip.
const PgBouncerParams = "default_query_exec_mode=cache_describe"

// Stack is a running checkout service. Every part is stopped and every
// resource it created (database, Redis keys, RabbitMQ exchange and queues)
// removed in the TB's cleanup.
type Stack struct {
	t    TB
	opts Options

	// DB is a pool on the stack's database, straight to PostgreSQL (not
	// through a proxy), for the counts.
	DB *pgxpool.Pool
	// DatabaseURL is the stack's database, straight to PostgreSQL.
	DatabaseURL string
	// RedisPrefix is REDIS_KEY_PREFIX.
	RedisPrefix string
	// Names are the RabbitMQ exchange and queues of this stack.
	Names rabbitmq.Names

	// The processes.
	Emulator, Sink, API, Dispatcher, Worker *Process
	// The dependency links: Redis and Postgres of the api, Postgres of the
	// dispatcher and of the worker, RabbitMQ of the dispatcher and of the
	// worker.
	Redis, PGAPI, PGDispatcher, PGWorker, AMQPDispatcher, AMQPWorker *Proxy
	// Gateway is the load balancer in front of the api.
	Gateway *Gateway

	// APIURL, EmulatorURL and SinkURL are the processes' HTTP base URLs;
	// DispatcherOps and WorkerOps serve /metrics, /healthz and /readyz.
	APIURL, EmulatorURL, SinkURL, DispatcherOps, WorkerOps string

	proxies *Proxies
}

// Start starts a stack and registers its teardown with t.
func Start(t TB, opts Options) *Stack {
	t.Helper()
	s, err := start(t, opts)
	if err != nil {
		t.Fatalf("stack: %v", err)
	}
	return s
}

func start(t TB, opts Options) (*Stack, error) {
	if opts.BinDir == "" {
		return nil, fmt.Errorf("Options.BinDir is required")
	}
	if opts.GatewayTimeout == 0 {
		opts.GatewayTimeout = 5 * time.Second
	}
	if opts.LogDir == "" {
		d, err := os.MkdirTemp("", "e2e-logs-")
		if err != nil {
			return nil, err
		}
		opts.LogDir = d
		t.Cleanup(func() {
			if !t.Failed() {
				os.RemoveAll(d)
			}
		})
	}
	if os.Getenv("E2E_PGBOUNCER") == "1" && opts.PostgresURL == "" {
		opts.PgBouncer = true
	}
	if opts.PgBouncer && opts.PostgresURL != "" {
		return nil, fmt.Errorf("Options.PgBouncer with PostgresURL: not supported")
	}
	id := testenv.Random(5)
	s := &Stack{t: t, opts: opts, proxies: newProxies()}
	t.Cleanup(s.proxies.Close)

	// The processes are stopped before anything they use is removed
	// (cleanups run last registered, first).
	if err := s.createDatabase(id); err != nil {
		return nil, err
	}
	if err := s.redisPrefix(id); err != nil {
		return nil, err
	}
	s.Names = rabbitmq.DefaultNames().WithPrefix("e2e." + id + ".")
	if opts.AMQPURL == "" {
		t.Cleanup(s.deleteTopology) // a broker of the test's own goes with its topology
	}

	// With PostgresURL the processes connect directly and the PG proxies,
	// unused, lead to the shared server.
	pgAddr, err := hostPort(pgtest.AdminURL())
	if err != nil {
		return nil, err
	}
	if opts.PgBouncer {
		b, err := pgtest.StartPgBouncer(t, pgAddr)
		if err != nil {
			return nil, err
		}
		pgAddr = b.Addr
		// The api does not migrate behind the pooler: migrate does, on a
		// direct connection, as a Kubernetes Job would.
		cmd := exec.Command(filepath.Join(opts.BinDir, "migrate"))
		cmd.Env = []string{"DATABASE_URL=" + s.DatabaseURL, "MIGRATE_TIMEOUT=1m"}
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("migrate: %w\n%s", err, out)
		}
	}
	amqpAddr, err := hostPort(rabbitmqtest.URL())
	if err != nil {
		return nil, err
	}
	redisAddr := opts.RedisAddr
	if redisAddr == "" {
		if redisAddr, err = hostPort(testenv.RedisURL()); err != nil {
			return nil, err
		}
	}
	for _, l := range []struct {
		p        **Proxy
		name     string
		upstream string
	}{
		{&s.Redis, "redis-api", redisAddr},
		{&s.PGAPI, "pg-api", pgAddr},
		{&s.PGDispatcher, "pg-dispatcher", pgAddr},
		{&s.PGWorker, "pg-worker", pgAddr},
		{&s.AMQPDispatcher, "amqp-dispatcher", amqpAddr},
		{&s.AMQPWorker, "amqp-worker", amqpAddr},
	} {
		if *l.p, err = s.proxies.Add(l.name, l.upstream); err != nil {
			return nil, err
		}
	}

	ports := map[string]string{}
	for _, name := range []string{"api", "emulator", "smtp", "sink", "dispatcher", "worker"} {
		p, err := testenv.Port()
		if err != nil {
			return nil, err
		}
		ports[name] = "127.0.0.1:" + strconv.Itoa(p)
	}
	s.APIURL = "http://" + ports["api"]
	s.EmulatorURL = "http://" + ports["emulator"]
	s.SinkURL = "http://" + ports["sink"]
	s.DispatcherOps = "http://" + ports["dispatcher"]
	s.WorkerOps = "http://" + ports["worker"]

	dbName := strings.TrimPrefix(mustParse(s.DatabaseURL).Path, "/")
	pgVia := func(p *Proxy) string {
		if opts.PostgresURL != "" {
			return s.DatabaseURL
		}
		u := "postgres://postgres@" + p.Addr() + "/" + dbName + "?sslmode=disable"
		if opts.PgBouncer {
			u += "&" + PgBouncerParams
		}
		return u
	}
	amqpVia := func(p *Proxy) string {
		if opts.AMQPURL != "" {
			return opts.AMQPURL
		}
		u := mustParse(rabbitmqtest.URL())
		u.Host = p.Addr()
		return u.String()
	}
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LOG_LEVEL=info", "SHUTDOWN_TIMEOUT=5s"}
	env := func(name string, kv ...string) []string {
		e := append(append([]string{}, base...), kv...)
		for k, v := range opts.Env[name] {
			e = append(e, k+"="+v)
		}
		return e
	}
	apiEnv := []string{
		"HTTP_ADDR=" + ports["api"],
		"DATABASE_URL=" + pgVia(s.PGAPI),
		"REDIS_URL=redis://" + s.Redis.Addr() + "/0",
		"REDIS_KEY_PREFIX=" + s.RedisPrefix,
		"STRIPE_API_BASE=" + s.EmulatorURL,
		"DATABASE_MAX_CONNS=30",
	}
	if opts.PgBouncer {
		apiEnv = append(apiEnv, "MIGRATE_ON_START=false")
	}
	if opts.SearchLag <= 0 {
		opts.SearchLag = 300 * time.Millisecond
	}
	// The api and the worker run the same payment saga: same Stripe
	// timeouts, same search settle delay (the emulator's search lag).
	stripeEnv := []string{"STRIPE_SEARCH_SETTLE=" + opts.SearchLag.String()}
	for k, v := range map[string]time.Duration{"STRIPE_TIMEOUT": opts.StripeTimeout, "STRIPE_MAX_ELAPSED": opts.StripeMaxElapsed} {
		if v > 0 {
			stripeEnv = append(stripeEnv, k+"="+v.String())
		}
	}
	apiEnv = append(apiEnv, stripeEnv...)
	for k, v := range map[string]time.Duration{"IDEMPOTENCY_LEASE": opts.Lease, "IDEMPOTENCY_TTL": opts.TTL} {
		if v > 0 {
			apiEnv = append(apiEnv, k+"="+v.String())
		}
	}
	if opts.DedupFailureMode != "" {
		apiEnv = append(apiEnv, "DEDUP_FAILURE_MODE="+opts.DedupFailureMode)
	}
	topology := []string{"AMQP_EXCHANGE=" + s.Names.Exchange, "NOTIFY_QUEUE=" + s.Names.NotifyQueue}

	s.Emulator = newProcess("stripe-emulator", opts.BinDir, opts.LogDir, s.EmulatorURL+"/healthz",
		env("stripe-emulator", append([]string{"STRIPE_EMULATOR_ADDR=" + ports["emulator"], "STRIPE_EMULATOR_SEARCH_LAG=" + opts.SearchLag.String()},
			emulatorWebhookEnv(opts.Webhooks, s.APIURL)...)...))
	s.Sink = newProcess("smtp-sink", opts.BinDir, opts.LogDir, s.SinkURL+"/messages",
		env("smtp-sink", "SMTP_SINK_ADDR="+ports["smtp"], "SMTP_SINK_HTTP_ADDR="+ports["sink"]))
	s.API = newProcess("api", opts.BinDir, opts.LogDir, s.APIURL+"/readyz", env("api", apiEnv...))
	s.Dispatcher = newProcess("dispatcher", opts.BinDir, opts.LogDir, s.DispatcherOps+"/readyz",
		env("dispatcher", append([]string{"DATABASE_URL=" + pgVia(s.PGDispatcher), "AMQP_URL=" + amqpVia(s.AMQPDispatcher),
			"METRICS_ADDR=" + ports["dispatcher"], "OUTBOX_POLL_INTERVAL=200ms"}, topology...)...))
	// The worker's completer runs the checkout state machine: it must reach
	// this stack's emulator, with the api's lease and TTL.
	workerEnv := []string{"DATABASE_URL=" + pgVia(s.PGWorker), "AMQP_URL=" + amqpVia(s.AMQPWorker),
		"METRICS_ADDR=" + ports["worker"], "SMTP_ADDR=" + ports["smtp"], "NOTIFY_SWEEP_INTERVAL=200ms",
		"STRIPE_API_BASE=" + s.EmulatorURL, "RECONCILER_INTERVAL=300ms", "ORPHAN_SWEEP_INTERVAL=1s"}
	workerEnv = append(workerEnv, stripeEnv...)
	for k, v := range map[string]time.Duration{"IDEMPOTENCY_LEASE": opts.Lease, "IDEMPOTENCY_TTL": opts.TTL} {
		if v > 0 {
			workerEnv = append(workerEnv, k+"="+v.String())
		}
	}
	s.Worker = newProcess("worker", opts.BinDir, opts.LogDir, s.WorkerOps+"/readyz",
		env("worker", append(workerEnv, topology...)...))

	procs := []*Process{s.Emulator, s.Sink, s.API}
	if !opts.NoBackground {
		procs = append(procs, s.Dispatcher, s.Worker)
	}
	for _, p := range procs {
		p := p
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("---- %s log (last lines, full log in %s) ----\n%s", p.Name, opts.LogDir, p.LogTail(40))
			}
			p.Kill()
		})
		if err := p.Start(); err != nil {
			return nil, err
		}
	}

	g, err := newGateway(s.APIURL, opts.GatewayTimeout)
	if err != nil {
		return nil, err
	}
	s.Gateway = g
	t.Cleanup(g.close)
	return s, nil
}

// createDatabase creates an empty database (the api migrates it at start)
// and drops it, with FORCE for connections a killed process left behind.
func (s *Stack) createDatabase(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, s.adminURL())
	if err != nil {
		return fmt.Errorf("connect %s: %w", s.adminURL(), err)
	}
	defer admin.Close(ctx)
	name := "e2e_" + id
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, s.adminURL())
		if err != nil {
			s.t.Logf("stack: drop %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			s.t.Logf("stack: drop %s: %v", name, err)
		}
	})
	u := mustParse(s.adminURL())
	u.Path = "/" + name
	s.DatabaseURL = u.String()
	pool, err := pgxpool.New(ctx, s.DatabaseURL)
	if err != nil {
		return err
	}
	s.DB = pool
	s.t.Cleanup(pool.Close)
	return nil
}

// adminURL is the PostgreSQL server's "postgres" database: Options'
// PostgresURL, else the shared server.
func (s *Stack) adminURL() string {
	if s.opts.PostgresURL != "" {
		return s.opts.PostgresURL
	}
	return pgtest.AdminURL()
}

// redisPrefix picks the stack's REDIS_KEY_PREFIX and, on the shared Redis,
// deletes its keys at the end.
func (s *Stack) redisPrefix(id string) error {
	s.RedisPrefix = "e2e:" + id + ":"
	if s.opts.RedisAddr != "" {
		return nil
	}
	opts, err := redis.ParseURL(testenv.RedisURL())
	if err != nil {
		return err
	}
	s.t.Cleanup(func() {
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, s.RedisPrefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	})
	return nil
}

func (s *Stack) deleteTopology() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rabbitmq.Dial(ctx, rabbitmq.Config{URL: rabbitmqtest.URL(), Name: "e2e-cleanup"})
	if err != nil {
		s.t.Logf("stack: cleanup rabbitmq: %v", err)
		return
	}
	defer c.Close()
	ch, err := c.Channel(ctx)
	if err != nil {
		s.t.Logf("stack: cleanup rabbitmq: %v", err)
		return
	}
	defer ch.Close()
	if err := rabbitmq.DeleteTopology(ch, s.Names); err != nil {
		s.t.Logf("stack: cleanup rabbitmq: %v", err)
	}
}

// Client returns a client of tenant acme that goes through the gateway;
// one attempt is bounded by 30s (the gateway answers before).
func (s *Stack) Client() *Client {
	return &Client{BaseURL: s.Gateway.URL, APIKey: "sk_test_acme", HTTP: &http30}
}

// AddProxy starts a toxiproxy link named name in front of upstream
// (host:port), e.g. in front of the api (HostPort(s.APIURL)) for a test
// that drops its answers. It is closed in the TB's cleanup.
func (s *Stack) AddProxy(name, upstream string) (*Proxy, error) {
	return s.proxies.Add(name, upstream)
}

// HostPort returns the host:port of an absolute URL such as s.APIURL.
func HostPort(rawURL string) (string, error) { return hostPort(rawURL) }

// DirectClient returns a client of tenant acme that calls the api itself.
func (s *Stack) DirectClient() *Client {
	return &Client{BaseURL: s.APIURL, APIKey: "sk_test_acme", HTTP: &http30}
}

func hostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return "", fmt.Errorf("%s: %w", raw, err)
	}
	return u.Host, nil
}

func mustParse(raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err)
	}
	return u
}

// AddWorker starts another worker process beside s.Worker, a second
// replica with the same settings and its own metrics port, and returns it
// with its ops URL. It is killed in the TB's cleanup.
func (s *Stack) AddWorker() (*Process, string, error) {
	port, err := testenv.Port()
	if err != nil {
		return nil, "", err
	}
	ops := "http://127.0.0.1:" + strconv.Itoa(port)
	env := make([]string, 0, len(s.Worker.env))
	for _, kv := range s.Worker.env {
		if !strings.HasPrefix(kv, "METRICS_ADDR=") {
			env = append(env, kv)
		}
	}
	env = append(env, "METRICS_ADDR=127.0.0.1:"+strconv.Itoa(port))
	p := newProcess("worker", s.opts.BinDir, s.opts.LogDir, ops+"/readyz", env)
	p.logPath = filepath.Join(s.opts.LogDir, "worker-"+strconv.Itoa(port)+".log")
	s.t.Cleanup(p.Kill)
	if err := p.Start(); err != nil {
		return nil, "", err
	}
	return p, ops, nil
}

// AddDispatcher starts another dispatcher process beside s.Dispatcher, a
// second replica with the same settings (and the same proxied links) and
// its own metrics port. It is killed in the TB's cleanup.
func (s *Stack) AddDispatcher() (*Process, error) {
	port, err := testenv.Port()
	if err != nil {
		return nil, err
	}
	ops := "http://127.0.0.1:" + strconv.Itoa(port)
	env := make([]string, 0, len(s.Dispatcher.env))
	for _, kv := range s.Dispatcher.env {
		if !strings.HasPrefix(kv, "METRICS_ADDR=") {
			env = append(env, kv)
		}
	}
	env = append(env, "METRICS_ADDR=127.0.0.1:"+strconv.Itoa(port))
	p := newProcess("dispatcher", s.opts.BinDir, s.opts.LogDir, ops+"/readyz", env)
	p.logPath = filepath.Join(s.opts.LogDir, "dispatcher-"+strconv.Itoa(port)+".log")
	s.t.Cleanup(p.Kill)
	if err := p.Start(); err != nil {
		return nil, err
	}
	return p, nil
}
