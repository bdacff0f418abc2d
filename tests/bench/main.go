// Command bench is the benchmark of record (`make bench`): it runs the real
// binaries as a user deploys them (api, dispatcher, worker, the Stripe
// emulator and an SMTP sink, each its own process, on a fresh database),
// drives them with wrk from a separate process that does not check answers
// in the timed loop, and measures in the same run what this machine can do
// with the same work: pgbench of the checkout's own SQL, of a minimal
// durable checkout and of the worker's SQL, a bare gin handler under the
// same load generator, raw RabbitMQ publishing with a window of confirms,
// and a bare publisher's confirm latency under the paced checkouts of the
// commit-to-confirm point. At the 16-client checkout point and during
// pgbench of the checkout's SQL it also reads from /proc the CPU each
// group of processes spent per checkout (cpu.go): where the machine's two
// cores go. It repeats that -runs times, writes the median of each figure
// and ratio to bench/results/latest.json and a dated copy, and prints them.
//
// `bench gin` is the bare gin handler, run by bench as its own process.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/testenv"
	"github.com/onceonly/checkout/migrations"
)

type config struct {
	root, binDir, logDir, luaPath, outDir string
	baseline                              string // binaries of the code to compare with (-baseline), or ""
	pgAdmin, redisURL, amqpURL            string
	runs                                  int
	dur                                   time.Duration
	largeKeys                             int
	only                                  map[string]bool
	// merge keeps, from the record in outDir/latest.json, every figure the
	// sections of this record (-only) did not measure.
	merge bool
}

// want reports whether section runs (-only, for working on one part; the
// record runs them all).
func (c *config) want(section string) bool { return len(c.only) == 0 || c.only[section] }

var benchCfg config

// targets are issue 20's restated targets and issue 38's: same-run
// ratios, each judged on the median of the runs with its spread beside it.
// below: the figure must stay at or below the bound. checkout_over_baseline
// is judged only when -baseline names binaries to compare with. Issue 38
// dropped go_cpu_over_pg_cpu <= 0.5, sql_over_minimal >= 0.33 and
// confirm_over_raw <= 1.5, which cannot be met by design (bench/README.md
// says why); they are still measured and recorded.
var targets = []struct {
	key   string
	bound float64
	below bool
}{
	{"exactly_once_over_naive", 0.5, false},
	{"exactly_once_p50_over_naive", 2, true},
	{"tracing_on_over_off", 0.95, false},
	{"dispatch_over_raw_publish", 0.7, false},
	{"hot_sku_over_spread", 0.8, false},
	{"replay_over_http", 0.3, false},
	{"worker_over_pgbench", 0.6, false},
	{"large_table_over_empty", 0.9, false},
	{"checkout_over_baseline", 0.9, false},
}

var curveClients = []int{1, 4, 16, 64}

// the concurrency every ratio compares at
const clients = 16

func main() {
	if len(os.Args) > 1 && os.Args[1] == "gin" {
		serveGin()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "naive" {
		serveNaive()
		return
	}
	c := &benchCfg
	flag.IntVar(&c.runs, "runs", 5, "runs; the record is the median, with the spread")
	flag.DurationVar(&c.dur, "dur", 5*time.Second, "duration of each timed point")
	flag.StringVar(&c.binDir, "bin", "bin", "directory of the built binaries (make build)")
	flag.StringVar(&c.baseline, "baseline", "", "directory of another build's binaries (scripts/bench.sh BASELINE=<rev>): the 16-client checkout of both, alternately, in each run")
	flag.StringVar(&c.outDir, "out", "bench/results", "where latest.json and the dated copy go")
	flag.IntVar(&c.largeKeys, "large-keys", 5_000_000, "idempotency keys in the large-table database")
	flag.BoolVar(&c.merge, "merge", false, "with -only: keep the figures of the sections not run from the last record (outDir/latest.json)")
	only := flag.String("only", "", "comma-separated sections to run, for development: curve,naive,spread,replay,paced,broker,large,gin,pgbench,ab,tracing")
	flag.Parse()
	if *only != "" {
		c.only = map[string]bool{}
		for _, o := range strings.Split(*only, ",") {
			c.only[o] = true
		}
	}
	c.pgAdmin = env("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	c.redisURL = env("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
	c.amqpURL = env("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	cleanUpOnSignal()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func uptime() string {
	out, _ := exec.Command("uptime").Output()
	return strings.TrimSpace(string(out))
}

func logf(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(c *config) error {
	var err error
	if c.root, err = os.Getwd(); err != nil {
		return err
	}
	c.binDir, _ = filepath.Abs(c.binDir)
	if c.baseline != "" {
		c.baseline, _ = filepath.Abs(c.baseline)
	}
	c.luaPath = filepath.Join(c.root, "tests/bench/checkout.lua")
	c.logDir = filepath.Join(c.root, "tmp/bench")
	os.RemoveAll(c.logDir)
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return err
	}
	for _, tool := range []string{"wrk", "pgbench"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (scripts/bench.sh installs wrk)", tool)
		}
	}
	started := time.Now()
	before := uptime()
	logf("load before: %s", before)
	large := ""
	if c.want("large") {
		if large, err = largeDB(c); err != nil {
			return fmt.Errorf("large-table database: %w", err)
		}
	}
	var runs []map[string]float64
	for i := range c.runs {
		logf("run %d of %d (%s)", i+1, c.runs, uptime())
		r, err := oneRun(c, i, large)
		if err != nil {
			return fmt.Errorf("run %d: %w", i+1, err)
		}
		runs = append(runs, r)
	}
	after := uptime()
	return report(c, runs, before, after, time.Since(started))
}

// oneRun measures everything once and returns every figure and ratio.
func oneRun(c *config, i int, large string) (map[string]float64, error) {
	ctx := context.Background()
	f := map[string]float64{}
	id := fmt.Sprintf("r%d%s", i, testenv.Random(3))

	// The service on a fresh database.
	name := "bench_" + id
	url, err := createDB(ctx, name)
	if err != nil {
		return nil, err
	}
	defer dropDB(name)
	s, err := startStack(c, c.binDir, url, id)
	if err != nil {
		return nil, err
	}
	defer s.stop()
	// 1,000 more skus for the spread load, and orders for the relay's and
	// the worker's events.
	if err := execSQL(ctx, url,
		`INSERT INTO products (sku, name, unit_amount, currency, stock)
		 SELECT format('sku_b%s', lpad(g::text, 4, '0')), 'Bench '||g, 1000, 'usd', 10000000 FROM generate_series(0, 999) g`,
		fmt.Sprintf(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		 SELECT 'ord_bench_'||g, 'acme', 'paid', 'buyer@example.com', 'usd', 2500, 'pm_card_visa', now(), now()
		 FROM generate_series(1, %d) g`, relayEvents/2),
		// The order that rawPublish's order.paid messages name: the worker
		// records them (one notification, the rest inbox duplicates)
		// instead of failing the notification's foreign key on each.
		`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		 VALUES ('ord_0192f0c4b7a87c3e9d5e2f1a0b4c6d8e', 'acme', 'paid', 'buyer@example.com', 'usd', 2500, 'pm_card_visa', now(), now())`,
	); err != nil {
		return nil, err
	}

	// pgbench's database, of the same schema, made now so that each
	// ratio's two figures are measured one right after the other: the
	// machine's load moves within a run.
	pgURL, dropPG, err := pgbenchDB(c, id)
	if err != nil {
		return nil, err
	}
	defer dropPG()

	// Checkouts, all of one sku, at 1, 4 and 16 clients; the same spread
	// over 1,000 skus; 64 clients; then pgbench of the same SQL and of the
	// minimal checkout.
	ceiling := 0.0
	curve := func(n int) error {
		if !c.want("curve") && n != clients {
			return nil
		}
		before, err := sampleCPU(s)
		if err != nil {
			return err
		}
		l, err := wrk(s.apiURL, n, c.dur, "new", id+"-hot"+fmt.Sprint(n), "0", "0")
		if err != nil {
			return err
		}
		after, err := sampleCPU(s)
		if err != nil {
			return err
		}
		logf("  checkout, one sku, %2d clients: %7.1f/s  p50 %6.1f ms  p99 %6.1f ms  errors %d", n, l.Rate, l.P50ms, l.P99ms, l.Errors)
		if n == clients {
			// Its events and emails are relayed and sent meanwhile, as
			// those of the point before were: a steady state.
			cpuPer(f, "cpu_checkout", before, after, l.Rate*c.dur.Seconds())
			logf("    %s", cpuLine(f, "cpu_checkout"))
		}
		put(f, fmt.Sprintf("checkout_hot_c%d", n), l)
		ceiling = max(ceiling, l.Rate)
		return nil
	}
	// Two seconds of the same load first, as before the large-table
	// points: a fresh stack's first load at 16 clients is also when its
	// pools open their connections and each new PostgreSQL session
	// prepares its statements and compiles reserve_stock; that start-up
	// belongs to no point of the curve.
	if c.want("curve") || c.want("spread") {
		if _, err := wrk(s.apiURL, clients, 2*time.Second, "new", id+"-warm", "0", "0"); err != nil {
			return nil, err
		}
	}
	for _, n := range curveClients[:3] {
		if err := curve(n); err != nil {
			return nil, err
		}
	}
	var l load
	if c.want("spread") {
		if l, err = wrk(s.apiURL, clients, c.dur, "new", id+"-spread", "1000", "0"); err != nil {
			return nil, err
		}
		logf("  checkout, 1,000 skus, %d clients: %7.1f/s  p99 %6.1f ms", clients, l.Rate, l.P99ms)
		put(f, "checkout_spread", l)
	}
	if err := curve(curveClients[3]); err != nil {
		return nil, err
	}
	// The naive checkout on the same stack, right after the full one.
	if err := naiveCurve(c, s, f, id); err != nil {
		return nil, err
	}
	if err := pgbenches(c, f, pgURL, "pgbench_checkout", "pgbench_minimal"); err != nil {
		return nil, err
	}

	// Replays of one finished key, then the bare gin handler.
	if c.want("replay") {
		if l, err = wrk(s.apiURL, 1, time.Second, "new", id+"-replay", "0", "0"); err != nil || l.Rate == 0 {
			return nil, fmt.Errorf("replay setup: %v", err)
		}
		// wrk's first key of thread 1 is <prefix>-1-1. A second of replays
		// first: until one has put the response in Redis, replays that
		// find no cached response contend for the key's lease (409).
		if _, err = wrk(s.apiURL, 1, time.Second, "replay", id+"-replay-1-1", "0", "0"); err != nil {
			return nil, err
		}
		if l, err = wrk(s.apiURL, clients, c.dur, "replay", id+"-replay-1-1", "0", "0"); err != nil {
			return nil, err
		}
		logf("  replay, %d clients: %7.1f/s  p99 %6.1f ms  errors %d", clients, l.Rate, l.P99ms, l.Errors)
		put(f, "replay", l)
	}
	if err := bareGin(c, f, id); err != nil {
		return nil, err
	}
	if err := paced(c, s, f, ceiling, id); err != nil {
		return nil, err
	}
	if err := broker(c, s, f, url); err != nil {
		return nil, err
	}
	s.stop() // the worker would go on with the backlog's other events
	if c.want("broker") {
		if err := pgbenches(c, f, pgURL, "pgbench_worker"); err != nil {
			return nil, err
		}
	}
	if err := largeTable(c, f, large, id); err != nil {
		return nil, err
	}
	if err := baseline(c, f, i, id); err != nil {
		return nil, err
	}
	if err := tracingPoint(c, f, i, id); err != nil {
		return nil, err
	}
	ratios(f)
	return f, nil
}

func ratios(f map[string]float64) {
	f["checkout_over_pgbench"] = f["checkout_hot_c16_per_s"] / f["pgbench_checkout_tps"]
	f["sql_over_minimal"] = f["pgbench_checkout_tps"] / f["pgbench_minimal_tps"]
	f["hot_sku_over_spread"] = f["checkout_hot_c16_per_s"] / f["checkout_spread_per_s"]
	f["replay_over_http"] = f["replay_per_s"] / f["bare_gin_per_s"]
	f["dispatch_over_raw_publish"] = f["relay_per_s"] / f["raw_publish_per_s"]
	f["worker_over_pgbench"] = f["worker_per_s"] / f["pgbench_worker_events_per_s"]
	f["large_table_over_empty"] = f["checkout_large_per_s"] / f["checkout_empty_per_s"]
	// The Go processes' CPU per checkout over PostgreSQL's, at the
	// 16-client point: what the service adds to the SQL it must run.
	goCPU := f["cpu_checkout_api_ms"] + f["cpu_checkout_dispatcher_ms"] + f["cpu_checkout_worker_ms"]
	f["go_cpu_over_pg_cpu"] = goCPU / f["cpu_checkout_postgres_ms"]
	// The relay's commit-to-confirm p99 over a bare publisher's confirm
	// p99 in the same window of paced load: the broker's own latency, and
	// the machine's stalls in that window, divided out.
	f["confirm_over_raw"] = f["paired_commit_to_publish_p99_ms"] / f["raw_confirm_p99_ms"]
	// What exactly-once costs (issue 38): the full checkout against the
	// naive one on the same stack, throughput at 16 clients and p50 at 1;
	// and tracing every span against tracing off.
	f["exactly_once_over_naive"] = f["checkout_hot_c16_per_s"] / f["naive_c16_per_s"]
	f["exactly_once_p50_over_naive"] = f["checkout_hot_c1_p50_ms"] / f["naive_c1_p50_ms"]
	f["tracing_on_over_off"] = f["tracing_on_per_s"] / f["tracing_off_per_s"]
	if f["baseline_checkout_per_s"] > 0 {
		f["checkout_over_baseline"] = f["ab_checkout_per_s"] / f["baseline_checkout_per_s"]
	} else {
		f["checkout_over_baseline"] = math.NaN()
	}
}

// baseline measures the 16-client checkout of one sku with this build and
// with c.baseline's, each on its own fresh database and stack with two
// seconds of warm-up, one right after the other, the order alternating
// from run to run so that neither always gets the quieter machine.
func baseline(c *config, f map[string]float64, run int, id string) error {
	if c.baseline == "" || !c.want("ab") {
		return nil
	}
	points := []struct{ name, bin string }{{"ab_checkout", c.binDir}, {"baseline_checkout", c.baseline}}
	if run%2 == 1 {
		points[0], points[1] = points[1], points[0]
	}
	for _, p := range points {
		l, err := freshStackLoad(c, p.bin, "bench_"+p.name+"_"+id, id+p.name[:2])
		if err != nil {
			return err
		}
		logf("  checkout, one sku, %d clients, %s: %7.1f/s  p99 %6.1f ms", clients, p.bin, l.Rate, l.P99ms)
		put(f, p.name, l)
	}
	return nil
}

func paced(c *config, s *stack, f map[string]float64, ceiling float64, id string) error {
	if !c.want("paced") {
		return nil
	}

	// Commit to broker confirm at half the checkout ceiling: 16
	// connections on a schedule of ceiling/2 requests a second (each of
	// wrk's 2 threads sends half).
	rate := ceiling / 2
	// A second of the same load first: the relay, idle during the points
	// before, polls at its slowest (OUTBOX_POLL_INTERVAL) until it finds
	// rows again; the figure is the steady state at this rate.
	if _, err := wrk(s.apiURL, clients, time.Second, "new", id+"-pacedwarm", "0", fmt.Sprintf("%.1f", rate/2)); err != nil {
		return err
	}
	lagBefore, err := metrics(s.dispOps, "checkout_outbox_publish_lag_seconds")
	if err != nil {
		return err
	}
	l, err := wrk(s.apiURL, clients, c.dur, "new", id+"-paced", "0", fmt.Sprintf("%.1f", rate/2))
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond) // the last events' confirms
	lagAfter, err := metrics(s.dispOps, "checkout_outbox_publish_lag_seconds")
	if err != nil {
		return err
	}
	f["paced_checkouts_per_s"] = l.Rate
	f["commit_to_publish_p50_ms"] = 1000 * histQuantile(0.5, lagBefore, lagAfter, "checkout_outbox_publish_lag_seconds")
	f["commit_to_publish_p99_ms"] = 1000 * histQuantile(0.99, lagBefore, lagAfter, "checkout_outbox_publish_lag_seconds")
	logf("  commit to confirm at %.0f checkouts/s (ceiling %.0f/s): p50 %.1f ms, p99 %.1f ms", l.Rate, ceiling,
		f["commit_to_publish_p50_ms"], f["commit_to_publish_p99_ms"])

	// The broker's own share, under the same load: the same paced
	// checkouts again while a bare publisher sends at the relay's rate of
	// events (two per checkout), each message as it comes (no batch), to a
	// queue of its own, and times each confirm. A relay's confirms can be
	// no faster than these. The relay's p99 in this same window is what
	// confirm_over_raw divides by them: a p99 of a few seconds' events is
	// a few dozen of them, which one stall of the machine sets, and a
	// stall in this window slows both.
	pairedBefore, err := metrics(s.dispOps, "checkout_outbox_publish_lag_seconds")
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		_, err := wrk(s.apiURL, clients, c.dur, "new", id+"-paced2", "0", fmt.Sprintf("%.1f", rate/2))
		done <- err
	}()
	p50, p99, err := rawConfirms(s, 2*l.Rate, c.dur)
	if werr := <-done; err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	pairedAfter, err := metrics(s.dispOps, "checkout_outbox_publish_lag_seconds")
	if err != nil {
		return err
	}
	f["raw_confirm_p50_ms"], f["raw_confirm_p99_ms"] = p50, p99
	f["paired_commit_to_publish_p99_ms"] = 1000 * histQuantile(0.99, pairedBefore, pairedAfter, "checkout_outbox_publish_lag_seconds")
	logf("  a bare publisher's confirms meanwhile, %.0f messages/s: p50 %.1f ms, p99 %.1f ms (the relay's p99 in the same window %.1f ms)",
		2*l.Rate, p50, p99, f["paired_commit_to_publish_p99_ms"])
	return nil
}

// broker measures the broker's limit, then the relay and the worker on a
// backlog.
func broker(c *config, s *stack, f map[string]float64, url string) error {
	if !c.want("broker") {
		return nil
	}
	ctx := context.Background()
	var err error
	s.byName["worker"].stop()
	// The broker's limit is measured before and after the relay, and the
	// higher of the two taken: a machine that got busier meanwhile must
	// not make the relay look better than it is.
	rawBefore, err := rawPublish(s, 2*time.Second, 512)
	if err != nil {
		return err
	}
	published := metric(s.dispOps, "checkout_outbox_published_total")
	if err := execSQL(ctx, url, fmt.Sprintf(`INSERT INTO outbox (id, tenant_id, aggregate_id, type, payload, occurred_at)
		SELECT 'evt_bench_'||g, 'acme', 'ord_bench_'||(g/2+1), t, json_build_object('id', 'evt_bench_'||g, 'type', t,
		  'occurred_at', now(), 'tenant_id', 'acme', 'data', (%s::jsonb || jsonb_build_object('id', 'ord_bench_'||(g/2+1))))::text::json, now()
		FROM generate_series(0, %d) g, LATERAL (SELECT CASE g %% 2 WHEN 0 THEN 'order.created' ELSE 'order.paid' END AS t) x`,
		quote(orderJSON), relayEvents-1),
		// A backlog builds up over minutes in real life, and autovacuum
		// keeps the outbox's statistics current meanwhile; one inserted in
		// a single transaction has to be analyzed by hand, or the claim's
		// plan is made for an empty table.
		`ANALYZE outbox`); err != nil {
		return err
	}
	if f["relay_per_s"], err = drain(s.dispOps, "checkout_outbox_published_total", published, relayEvents, 60*time.Second); err != nil {
		return err
	}
	rawAfter, err := rawPublish(s, 2*time.Second, 512)
	if err != nil {
		return err
	}
	f["raw_publish_per_s"] = max(rawBefore, rawAfter)
	logf("  relay of %d events: %.0f/s; raw publish, window of 512 confirms, before and after: %.0f/s, %.0f/s",
		relayEvents, f["relay_per_s"], rawBefore, rawAfter)
	w := s.byName["worker"]
	if err := w.start(); err != nil {
		return err
	}
	// The worker's two stages run at once: the consumer records the events
	// and the sender emails the paid ones (one in two of the backlog). A
	// consumer that outruns its sender only leaves emails for later, so the
	// worker's rate of events is the slower of the two: the consumer's, or
	// the sender's emails per second times the events per email, measured
	// on the same events (workerEvents, and their workerEvents/2 emails).
	rates, err := drainAll(s.workOps, "checkout_notify_",
		[]string{"checkout_notify_events_processed_total", "checkout_notify_emails_sent_total"},
		[]float64{0, 0}, []int{workerEvents, workerEvents / 2}, 90*time.Second)
	if err != nil {
		return err
	}
	f["worker_events_per_s"], f["worker_emails_per_s"] = rates[0], rates[1]
	f["worker_per_s"] = min(rates[0], 2*rates[1])
	logf("  worker, %d events (half of them order.paid): %.0f/s; consumer %.0f events/s, sender %.0f emails/s",
		workerEvents, f["worker_per_s"], rates[0], rates[1])
	return nil
}

// largeTable runs the 16-client checkouts of one sku on a fresh database
// and, right after, on one holding c.largeKeys finished keys, each with
// its own freshly started stack, so that both points see the same machine.
func largeTable(c *config, f map[string]float64, large, id string) error {
	if !c.want("large") {
		return nil
	}
	ctx := context.Background()
	if err := execSQL(ctx, large, `DELETE FROM idempotency_keys WHERE tenant_id <> 'bench'`,
		`TRUNCATE orders, order_items, outbox, inbox, notifications CASCADE`); err != nil {
		return err
	}
	name := "bench_empty_" + id
	empty, err := createDB(ctx, name)
	if err != nil {
		return err
	}
	defer dropDB(name)
	for _, p := range []struct{ name, url, what string }{
		{"checkout_empty", empty, "an empty table"},
		{"checkout_large", large, fmt.Sprintf("%d keys in the table", c.largeKeys)},
	} {
		s, err := startStack(c, c.binDir, p.url, id+p.name[9:10])
		if err != nil {
			return err
		}
		// Two seconds of warm-up first: a fresh stack on a fresh database
		// starts slow (empty caches, statistics of empty tables).
		_, err = wrk(s.apiURL, clients, 2*time.Second, "new", id+"-warm-"+p.name, "0", "0")
		var l load
		if err == nil {
			l, err = wrk(s.apiURL, clients, c.dur, "new", id+"-"+p.name, "0", "0")
		}
		s.stop()
		if err != nil {
			return err
		}
		logf("  checkout, one sku, %d clients, %s: %7.1f/s  p99 %6.1f ms", clients, p.what, l.Rate, l.P99ms)
		put(f, p.name, l)
	}
	return nil
}

// bareGin is a gin handler answering 201, under the same load generator.
func bareGin(c *config, f map[string]float64, id string) error {
	if !c.want("gin") {
		return nil
	}
	g := &proc{name: "gin", bin: os.Args[0], ready: "", log: filepath.Join(c.logDir, id+"-gin.log")}
	addr := freeAddr()
	g.env = []string{"PATH=" + os.Getenv("PATH"), "GIN_ADDR=" + addr}
	g.ready = "http://" + addr + "/healthz"
	if err := g.start(); err != nil {
		return err
	}
	l, err := wrk("http://"+addr, clients, c.dur, "new", id+"-gin", "0", "0")
	g.stop()
	if err != nil {
		return err
	}
	logf("  bare gin 201, %d clients: %7.1f/s  p99 %6.1f ms", clients, l.Rate, l.P99ms)
	put(f, "bare_gin", l)
	return nil
}

// pgbenches runs the SQL scripts on a fresh database with the same schema.
func pgbenchDB(c *config, id string) (string, func(), error) {
	ctx := context.Background()
	pgName := "bench_pg_" + id
	pgURL, err := createDB(ctx, pgName)
	if err != nil {
		return "", nil, err
	}
	drop := func() { dropDB(pgName) }
	if err := migrate(ctx, pgURL); err != nil {
		drop()
		return "", nil, err
	}
	if err := execSQL(ctx, pgURL, fmt.Sprintf(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		SELECT g::text, 'acme', 'paid', 'buyer@example.com', 'usd', 2500, 'pm_card_visa', now(), now() FROM generate_series(1, %d) g`, workerOrders),
		`VACUUM ANALYZE`); err != nil {
		drop()
		return "", nil, err
	}
	return pgURL, drop, nil
}

// pgbenches runs the named scripts (internal/checkout/pgbench_checkout.sql,
// ...) with pgbench on pgURL, a database of the same schema the stack's
// processes do not use (they sit idle meanwhile).
func pgbenches(c *config, f map[string]float64, pgURL string, which ...string) error {
	if !c.want("pgbench") {
		return nil
	}
	scripts := map[string]string{
		"pgbench_checkout": "internal/checkout/pgbench_checkout.sql",
		"pgbench_minimal":  "tests/bench/minimal.sql",
		"pgbench_worker":   "internal/notify/pgbench_worker.sql",
	}
	// Events per transaction of a script that runs a batch of them, so
	// that its figure compares with the service's events per second.
	events := map[string]int{"pgbench_worker": notify.BatchSize}
	vars := pgbenchVars()
	for _, name := range which {
		// Each script starts right after a checkpoint: the WAL the run has
		// written so far (the large table, the relay's backlog) would
		// otherwise start one in the middle of some scripts and not of
		// others, and the first write of each page after it logs the
		// whole page.
		if err := execSQL(context.Background(), pgURL, "CHECKPOINT"); err != nil {
			return err
		}
		before, err := sampleCPU(nil)
		if err != nil {
			return err
		}
		tps, lat, txs, err := pgbench(pgURL, filepath.Join(c.root, scripts[name]), clients, c.dur, vars)
		if err != nil {
			return err
		}
		after, err := sampleCPU(nil)
		if err != nil {
			return err
		}
		if name == "pgbench_checkout" {
			cpuPer(f, "cpu_pgbench_checkout", before, after, float64(txs))
			if err := checkoutsDone(pgURL, txs); err != nil {
				return err
			}
		}
		f[name+"_tps"], f[name+"_latency_ms"] = tps, lat
		if n := events[name]; n > 0 {
			f[name+"_events_per_s"] = tps * float64(n)
			logf("  %s, %d clients: %.0f tps of %d events, %.0f events/s (latency %.1f ms)", scripts[name], clients, tps, n, tps*float64(n), lat)
			continue
		}
		logf("  %s, %d clients: %.0f tps (latency %.1f ms)", scripts[name], clients, tps, lat)
		if name == "pgbench_checkout" {
			logf("    %s", cpuLine(f, "cpu_pgbench_checkout"))
		}
	}
	return nil
}

// checkoutsDone checks that each of the txs checkouts pgbench ran of the
// checkout's script did the whole work, so that a statement that quietly
// changes nothing (a condition the constants fail) cannot make the SQL look
// fast: one paid order, two events, two attempts and one finished key
// each. The database is pgbench's own, and emptied for the next script.
func checkoutsDone(pgURL string, txs int64) error {
	ctx := context.Background()
	pool, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close(ctx)
	var paid, events, attempts, finished int64
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders WHERE status = 'paid' AND payment_intent_id IS NOT NULL AND id ~ '^[0-9]+$' AND id::numeric > $1),
		(SELECT count(*) FROM outbox), (SELECT count(*) FROM payment_attempts WHERE outcome = 'succeeded'),
		(SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished' AND response_status = 201)`, workerOrders).
		Scan(&paid, &events, &attempts, &finished)
	if err != nil {
		return fmt.Errorf("check the checkout script's work: %w", err)
	}
	if paid != txs || events != 2*txs || attempts != 2*txs || finished != txs {
		return fmt.Errorf("pgbench of the checkout's SQL ran %d checkouts but left %d paid orders, %d events, %d succeeded attempts, %d finished keys",
			txs, paid, events, attempts, finished)
	}
	logf("  (checked: %d paid orders, each with its 2 events, 2 attempts and finished key)", paid)
	return nil
}

// relayEvents is the backlog the relay drains (half of them order.paid);
// the worker is timed on the first workerEvents of them.
const (
	relayEvents  = 50000
	workerEvents = 10000
)

// freshStackLoad measures the checkout of one sku by clients clients for
// c.dur, after two seconds of warm-up, on a stack of the binaries in bin
// started for this point alone: the database db (created, then dropped),
// names made from names, and env added to every process's environment. It
// returns wrk's rate and latencies, or the first error of the database,
// the stack or wrk.
func freshStackLoad(c *config, bin, db, names string, env ...string) (load, error) {
	url, err := createDB(context.Background(), db)
	if err != nil {
		return load{}, err
	}
	defer dropDB(db)
	s, err := startStack(c, bin, url, names, env...)
	if err != nil {
		return load{}, err
	}
	defer s.stop()
	if _, err := wrk(s.apiURL, clients, 2*time.Second, "new", names+"-warm", "0", "0"); err != nil {
		return load{}, err
	}
	return wrk(s.apiURL, clients, c.dur, "new", names, "0", "0")
}

func put(f map[string]float64, name string, l load) {
	f[name+"_per_s"], f[name+"_p50_ms"], f[name+"_p99_ms"], f[name+"_errors"] = l.Rate, l.P50ms, l.P99ms, float64(l.Errors)
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func migrate(ctx context.Context, url string) error {
	db, err := postgres.Open(ctx, postgres.Config{URL: url, MaxConns: 2})
	if err != nil {
		return err
	}
	defer postgres.Close(db)
	return postgres.Migrate(ctx, db, slog.New(slog.DiscardHandler))
}

// largeDB returns a database holding c.largeKeys finished keys, built once
// per version of the migrations and kept between runs (bench_large_<hash>).
func largeDB(c *config) (string, error) {
	ctx := context.Background()
	h := sha256.New()
	entries, err := migrations.FS.ReadDir(".")
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		b, _ := migrations.FS.ReadFile(e.Name())
		h.Write(b)
	}
	fmt.Fprint(h, c.largeKeys)
	name := "bench_large_" + hex.EncodeToString(h.Sum(nil))[:12]
	admin, err := pgx.Connect(ctx, c.pgAdmin)
	if err != nil {
		return "", err
	}
	defer admin.Close(ctx)
	rows, err := admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 'bench_large_%'`)
	if err != nil {
		return "", err
	}
	var have []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		have = append(have, n)
	}
	rows.Close()
	found := false
	for _, n := range have {
		if n == name {
			found = true
			continue
		}
		dropDB(n) // built for older migrations
	}
	url := dbURL(name)
	if found {
		return url, nil
	}
	logf("building %s: %d finished keys (once per version of the migrations)", name, c.largeKeys)
	tmp := name + "_tmp"
	dropDB(tmp)
	tmpURL, err := createDB(ctx, tmp)
	if err != nil {
		return "", err
	}
	if err := migrate(ctx, tmpURL); err != nil {
		return "", err
	}
	if err := execSQL(ctx, tmpURL, fmt.Sprintf(`INSERT INTO idempotency_keys (tenant_id, route, key, fingerprint, recovery_point, order_id,
		  response_status, response_headers, response_body, created_at, updated_at, finished_at, expires_at)
		SELECT 'bench', 'POST /v1/checkouts', 'bench-key-'||g, md5(g::text)||md5((-g)::text), 'finished', 'ord_'||md5(g::text),
		  201, '{"Content-Type":["application/json"]}', convert_to(%s, 'UTF8'), now(), now(), now(), now() + interval '10 years'
		FROM generate_series(1, %d) g`, quote(orderJSON), c.largeKeys), `VACUUM ANALYZE`); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+tmp+" RENAME TO "+name); err != nil {
		return "", err
	}
	return url, nil
}

func finite(runs []map[string]float64) []map[string]float64 {
	out := make([]map[string]float64, len(runs))
	for i, r := range runs {
		out[i] = map[string]float64{}
		for k, v := range r {
			out[i][k] = round(v)
		}
	}
	return out
}

// record is what -merge reads of the last record.
type record struct {
	Date    string                `json:"date"`
	Figures map[string]float64    `json:"figures"`
	Spread  map[string][2]float64 `json:"spread"`
}

func readRecord(path string) (record, error) {
	var r record
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

// mergeFigures returns prev's figures with those this record measured
// laid over them: a figure is measured when it is a number (not -1) other
// than 0, or the error count of a measured point. A ratio of a section not run is NaN (-1) or
// 0, and keeps prev's value.
func mergeFigures(prev, med map[string]float64) map[string]float64 {
	out := maps.Clone(prev)
	if out == nil {
		out = map[string]float64{}
	}
	for k, v := range med {
		base, isErrors := strings.CutSuffix(k, "_errors")
		if v != -1 && (v != 0 || isErrors && med[base+"_per_s"] > 0) {
			out[k] = v
		}
	}
	return out
}

func median(xs []float64) float64 {
	s := append([]float64{}, xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return math.NaN()
	}
	return s[len(s)/2]
}

func report(c *config, runs []map[string]float64, before, after string, took time.Duration) error {
	med := map[string]float64{}
	for k := range runs[0] {
		var xs []float64
		for _, r := range runs {
			xs = append(xs, r[k])
		}
		med[k] = round(median(xs))
	}
	var prev record
	if c.merge {
		var err error
		if prev, err = readRecord(filepath.Join(c.outDir, "latest.json")); err != nil {
			return fmt.Errorf("merge: %w", err)
		}
		med = mergeFigures(prev.Figures, med)
	}
	out := map[string]any{
		"date":          time.Now().UTC().Format(time.RFC3339),
		"command":       "make bench",
		"runs":          c.runs,
		"baseline":      os.Getenv("BENCH_BASELINE_REV"),
		"seconds_each":  c.dur.Seconds(),
		"clients":       clients,
		"load_before":   before,
		"load_after":    after,
		"took_s":        math.Round(took.Seconds()),
		"figures":       med,
		"per_run":       finite(runs),
		"targets":       map[string]string{},
		"met":           map[string]bool{},
		"large_keys":    c.largeKeys,
		"nproc":         nproc(),
		"curve_clients": curveClients,
	}
	if c.merge {
		out["merged_into"] = prev.Date
		out["command"] = "bin/bench -merge -only " + strings.Join(slices.Sorted(maps.Keys(c.only)), ",")
	}
	fmt.Printf("\nmedian of %d runs, %gs per point (%s)\n\n", c.runs, c.dur.Seconds(), after)
	spread := map[string][2]float64{}
	out["spread"] = spread
	fmt.Printf("| key | median | spread (min to max) | target | met |\n|---|---|---|---|---|\n")
	for _, t := range targets {
		v := med[t.key]
		if v == -1 {
			continue // not measured in this record (-only, or no -baseline)
		}
		met := v >= t.bound
		op := ">="
		if t.below {
			met, op = v <= t.bound, "<="
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range runs {
			lo, hi = min(lo, r[t.key]), max(hi, r[t.key])
		}
		spread[t.key] = [2]float64{round(lo), round(hi)}
		if old, ok := prev.Spread[t.key]; ok && c.merge && (math.IsNaN(lo) || math.IsInf(lo, 0) || lo == 0) {
			spread[t.key] = old // not measured by this record: the last one's
			lo, hi = old[0], old[1]
		}
		out[t.key] = v
		out["targets"].(map[string]string)[t.key] = fmt.Sprintf("%s %g", op, t.bound)
		out["met"].(map[string]bool)[t.key] = met
		fmt.Printf("| `%s` | %.2f | %.2f to %.2f | %s %g | %s |\n", t.key, v, lo, hi, op, t.bound, yes(met))
	}
	fmt.Printf("\n| clients | checkouts/s (one sku) | p50 ms | p99 ms |\n|---|---|---|---|\n")
	var curve []map[string]float64
	for _, n := range curveClients {
		k := fmt.Sprintf("checkout_hot_c%d", n)
		curve = append(curve, map[string]float64{"clients": float64(n), "per_s": med[k+"_per_s"], "p50_ms": med[k+"_p50_ms"], "p99_ms": med[k+"_p99_ms"]})
		fmt.Printf("| %d | %.0f | %.1f | %.1f |\n", n, med[k+"_per_s"], med[k+"_p50_ms"], med[k+"_p99_ms"])
	}
	out["curve"] = curve
	var naive []map[string]float64
	for _, n := range curveClients {
		k := fmt.Sprintf("naive_c%d", n)
		naive = append(naive, map[string]float64{"clients": float64(n), "per_s": med[k+"_per_s"], "p50_ms": med[k+"_p50_ms"], "p99_ms": med[k+"_p99_ms"]})
	}
	out["naive_curve"] = naive
	fmt.Printf("\n| figure | median |\n|---|---|\n")
	for _, k := range []string{"checkout_over_pgbench", "commit_to_publish_p99_ms", "ab_checkout_per_s", "baseline_checkout_per_s", "checkout_hot_c16_per_s", "checkout_spread_per_s", "checkout_empty_per_s", "checkout_large_per_s", "pgbench_checkout_tps",
		"pgbench_minimal_tps", "replay_per_s", "replay_p99_ms", "bare_gin_per_s", "relay_per_s", "raw_publish_per_s",
		"paced_checkouts_per_s", "commit_to_publish_p50_ms", "raw_confirm_p50_ms", "raw_confirm_p99_ms", "paired_commit_to_publish_p99_ms", "worker_per_s", "pgbench_worker_events_per_s",
		"naive_c16_per_s", "naive_c1_p50_ms", "checkout_hot_c1_p50_ms", "tracing_off_per_s", "tracing_on_per_s",
		"go_cpu_over_pg_cpu", "sql_over_minimal", "confirm_over_raw"} {
		fmt.Printf("| %s | %.1f |\n", k, med[k])
	}
	fmt.Printf("\n| CPU ms per checkout (median) | the service, one sku, %d clients | pgbench of its SQL |\n|---|---|---|\n", clients)
	for _, g := range append(cpuGroups, "total") {
		a, b := med["cpu_checkout_"+g+"_ms"], med["cpu_pgbench_checkout_"+g+"_ms"]
		if a != 0 || b != 0 {
			fmt.Printf("| %s | %.2f | %.2f |\n", g, a, b)
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.outDir, 0o755); err != nil {
		return err
	}
	dated := filepath.Join(c.outDir, time.Now().UTC().Format("2006-01-02T150405Z")+".json")
	for _, p := range []string{filepath.Join(c.outDir, "latest.json"), dated} {
		if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if c.want("curve") && c.want("naive") {
		png := filepath.Join(c.outDir, "exactly-once-cost.png")
		if err := plotCurves(med, png); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		fmt.Printf("\nwrote %s\n", png)
	}
	fmt.Printf("\nwrote %s and %s (took %s)\n", filepath.Join(c.outDir, "latest.json"), dated, took.Round(time.Second))
	return nil
}

// round keeps three decimals; a figure that could not be computed (a
// section left out with -only) is -1, since JSON has no NaN.
func round(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return -1
	}
	return math.Round(x*1000) / 1000
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

func nproc() string {
	out, _ := exec.Command("nproc").Output()
	return strings.TrimSpace(string(out))
}

// serveGin is the bare gin handler: it reads the body and answers 201 with
// an order-sized JSON body and a Location, nothing else.
func serveGin() {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.GET("/healthz", func(c *gin.Context) { c.Status(http.StatusOK) })
	body := []byte(orderJSON)
	r.POST("/v1/checkouts", func(c *gin.Context) {
		io.Copy(io.Discard, c.Request.Body)
		c.Header("Location", "/v1/orders/ord_0192f0c4b7a87c3e9d5e2f1a0b4c6d8e")
		c.Data(http.StatusCreated, "application/json", body)
	})
	if err := http.ListenAndServe(os.Getenv("GIN_ADDR"), r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
