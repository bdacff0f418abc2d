package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// load is what a load generator measured at one point.
type load struct {
	Clients int     `json:"clients"`
	Rate    float64 `json:"per_s"` // successful (2xx) answers per second
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	Errors  int     `json:"errors"` // non-2xx answers and socket errors
}

var wrkLine = regexp.MustCompile(`WRKJSON (\{.*\})`)

// wrk runs wrk with checkout.lua against url/v1/checkouts with clients
// connections for d; args are the script's (mode, prefix, skus, delay).
func wrk(url string, clients int, d time.Duration, args ...string) (load, error) {
	threads := min(clients, 2)
	cmdArgs := []string{"-t", strconv.Itoa(threads), "-c", strconv.Itoa(clients),
		"-d", fmt.Sprintf("%ds", int(d.Seconds())), "--timeout", "10s", "-s", benchCfg.luaPath, url, "--"}
	out, err := exec.Command("wrk", append(cmdArgs, args...)...).CombinedOutput()
	if err != nil {
		return load{}, fmt.Errorf("wrk: %w\n%s", err, out)
	}
	m := wrkLine.FindSubmatch(out)
	if m == nil {
		return load{}, fmt.Errorf("wrk: no result line in:\n%s", out)
	}
	var r struct {
		Requests, StatusErrors, SocketErrors int
		DurationUS, P50US, P99US             float64
	}
	dec := json.NewDecoder(strings.NewReader(string(m[1])))
	var raw map[string]float64
	if err := dec.Decode(&raw); err != nil {
		return load{}, err
	}
	r.Requests, r.StatusErrors, r.SocketErrors = int(raw["requests"]), int(raw["status_errors"]), int(raw["socket_errors"])
	r.DurationUS, r.P50US, r.P99US = raw["duration_us"], raw["p50_us"], raw["p99_us"]
	ok := r.Requests - r.StatusErrors
	return load{Clients: clients, Rate: float64(ok) / (r.DurationUS / 1e6), P50ms: r.P50US / 1000, P99ms: r.P99US / 1000,
		Errors: r.StatusErrors + r.SocketErrors}, nil
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
var txLine = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)
var latLine = regexp.MustCompile(`latency average = ([0-9.]+) ms`)

// pgbench runs script with clients connections for d on url and returns
// its transactions per second (and the average latency in ms).
func pgbench(url, script string, clients int, d time.Duration, vars map[string]string) (tps, latency float64, txs int64, err error) {
	args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 2)),
		"-T", strconv.Itoa(int(d.Seconds())), "-f", script}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-D", k+"="+vars[k])
	}
	var out []byte
	for try := 0; ; try++ {
		out, err = exec.Command("pgbench", append(args, url)...).CombinedOutput()
		// The server is shared: other sessions' tests can hold every
		// connection for a moment.
		if err == nil || try == 4 || !strings.Contains(string(out), "too many clients") {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("pgbench %s: %w\n%s", script, err, out)
	}
	m := tpsLine.FindSubmatch(out)
	n := txLine.FindSubmatch(out)
	if m == nil || n == nil {
		return 0, 0, 0, fmt.Errorf("pgbench: no tps in:\n%s", out)
	}
	tps, _ = strconv.ParseFloat(string(m[1]), 64)
	txs, _ = strconv.ParseInt(string(n[1]), 10, 64)
	if l := latLine.FindSubmatch(out); l != nil {
		latency, _ = strconv.ParseFloat(string(l[1]), 64)
	}
	return tps, latency, txs, nil
}

// pgbenchVars are the constants the scripts use (-D).
func pgbenchVars() map[string]string {
	now := time.Now().UTC()
	ts := func(t time.Time) string { return t.Format(time.RFC3339Nano) }
	payload := `{"id":"evt_bench","type":"order.created","occurred_at":"` + ts(now) + `","tenant_id":"acme","data":` + orderJSON + `}`
	return map[string]string{
		"tenant": "acme", "route": "POST /v1/checkouts", "fingerprint": strings.Repeat("ab", 32),
		"rp_started": "started", "rp_order_created": "order_created", "rp_finished": "finished",
		"owner": strings.Repeat("0f", 16), "now": ts(now), "lease_until": ts(now.Add(30 * time.Second)),
		"expires": ts(now.Add(24 * time.Hour)), "sku": "sku_tee", "skus": "{sku_tee}", "qtys": "{1}", "nskus": "1", "prices": "{2500}", "currencies": "{usd}", "lines": "{1}", "amounts": "{2500}", "qty": "1", "amount": "2500", "line": "1",
		"pending": "pending_payment", "email": "buyer@example.com", "currency": "usd", "pm": "pm_card_visa",
		// pgbench refuses an empty -D value; a return_url costs the same
		// statement one short text more than wrk's checkouts, which send none.
		"return_url": "https://shop.example/orders",
		"created":    "order.created", "payload": payload, "status": "201",
		"headers": `{"Content-Type":["application/json"],"Location":["/v1/orders/ord_bench"]}`,
		"body":    orderJSON, "paid": "paid", "pi": "pi_bench", "succeeded": "succeeded", "paid_event": "order.paid",
		"consumer": "notify.order_paid", "channel": "email", "ttl": "60s", "orders": strconv.Itoa(workerOrders),
		// The body of a sequenced event up to its number (outbox.Add).
		"payload_seq": payload[:len(payload)-1] + `,"sequence":`,
		"step_create": "create", "step_confirm": "confirm", "one": "1", "params": `{"amount":2500,"currency":"usd"}`,
		"pi_created": "requires_confirmation", "payment_unknown": "payment_unknown", "requires_action": "requires_action",
		"kind": "order_paid", "guard": "bench",
		// A traced checkout's traceparent (outbox and notification rows).
		"traceparent":  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"to_paid_from": "{pending_payment,payment_unknown,requires_action}",
	}
}

// orderJSON is an order as the API answers it, for bodies of the right size.
const orderJSON = `{"id":"ord_0192f0c4b7a87c3e9d5e2f1a0b4c6d8e","status":"paid","email":"buyer@example.com","currency":"usd","amount_total":2500,"items":[{"sku":"sku_tee","quantity":1,"unit_amount":2500,"amount":2500}],"payment":{"provider":"stripe","payment_intent_id":"pi_0192f0c4b7a87c3e9d5e2f1a","status":"succeeded"},"created_at":"2026-12-01T08:00:00.123456Z"}`

// workerOrders is how many orders the worker's pgbench database holds.
const workerOrders = 200000

// rawPublish publishes persistent messages straight to the stack's
// exchange with amqp091-go for d, keeping window confirms in flight, and
// returns the confirmed messages per second: what the broker can take.
func rawPublish(s *stack, d time.Duration, window int) (float64, error) {
	conn, err := amqp.Dial(benchCfg.amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	ctx := context.Background()
	body := []byte(`{"id":"evt_bench","type":"order.paid","occurred_at":"2026-12-01T08:00:00Z","tenant_id":"acme","data":` + orderJSON + `}`)
	// The relay's traffic: every event (order.created and order.paid alike,
	// the worker binds order.*) reaches one durable quorum queue. A queue
	// of its own stands in for the worker's, so that none of these reach
	// the worker's backlog.
	raw := s.names.NotifyQueue + ".raw"
	if _, err := ch.QueueDeclare(raw, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		return 0, err
	}
	defer ch.QueueDelete(raw, false, false, false)
	if err := ch.QueueBind(raw, "bench.raw", s.names.Exchange, false, nil); err != nil {
		return 0, err
	}
	types := []string{"order.created", "order.paid"}
	var inflight []*amqp.DeferredConfirmation
	confirmed := 0
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		if len(inflight) == window {
			if ok, err := inflight[0].WaitContext(ctx); err != nil || !ok {
				return 0, fmt.Errorf("raw publish: confirm %v %v", ok, err)
			}
			inflight = inflight[1:]
			confirmed++
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, s.names.Exchange, "bench.raw", false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: "evt_bench", Type: types[i%2], Body: body, Timestamp: time.Now()})
		if err != nil {
			return 0, err
		}
		inflight = append(inflight, dc)
	}
	for _, dc := range inflight {
		dc.WaitContext(ctx)
		confirmed++
	}
	return float64(confirmed) / time.Since(start).Seconds(), nil
}

// drainPoll is how often drain scrapes the process it times. Each scrape
// gathers all of the process's metrics, its /proc figures included: at 50 a
// second (every 20ms, as it was) that was a fifth of the dispatcher's CPU
// during the relay's drain (perf record -a), taken from the process timed.
const drainPoll = 100 * time.Millisecond

// drain waits until counter (a metric of ops) has grown by n from before and
// returns its rate (see drainAll).
func drain(ops, counter string, before float64, n int, limit time.Duration) (float64, error) {
	rates, err := drainAll(ops, counter, []string{counter}, []float64{before}, []int{n}, limit)
	if err != nil {
		return 0, err
	}
	return rates[0], nil
}

// drainAll waits until every counter of ops named in names (one scrape a
// poll; each name must start with prefix) has grown by its n from its
// before, and returns each one's rate between two polls inside its drain:
// the first that saw it grow and the last before it reached n. Neither end
// then holds time when nothing was left to do, however coarse the polls;
// a drain shorter than two polls is timed from the first to the last.
func drainAll(ops, prefix string, names []string, before []float64, ns []int, limit time.Duration) ([]float64, error) {
	type point struct {
		at time.Time
		v  float64
	}
	deadline := time.Now().Add(limit)
	first, last := make([]point, len(names)), make([]point, len(names))
	rates := make([]float64, len(names))
	left := len(names)
	for time.Now().Before(deadline) {
		m, err := metrics(ops, prefix)
		if err != nil {
			return nil, err
		}
		p := point{at: time.Now()}
		for i, name := range names {
			if rates[i] != 0 {
				continue
			}
			p.v = m[name] - before[i]
			if p.v > 0 && first[i].at.IsZero() {
				first[i] = p
			}
			if p.v < float64(ns[i]) {
				if p.v > 0 {
					last[i] = p
				}
				continue
			}
			end := last[i]
			if !end.at.After(first[i].at) {
				end = p
			}
			rates[i] = math.Inf(1)
			if d := end.at.Sub(first[i].at); d > 0 {
				rates[i] = (end.v - first[i].v) / d.Seconds()
			}
			left--
		}
		if left == 0 {
			return rates, nil
		}
		time.Sleep(drainPoll)
	}
	return nil, fmt.Errorf("%v: not all of %v after %s", names, ns, limit)
}

// histQuantile is Prometheus's histogram_quantile over the difference of two
// scrapes of a histogram's buckets.
func histQuantile(q float64, before, after map[string]float64, name string) float64 {
	type bucket struct{ le, n float64 }
	var bs []bucket
	re := regexp.MustCompile(`^` + name + `_bucket\{le="([^"]+)"\}$`)
	for k, v := range after {
		m := re.FindStringSubmatch(k)
		if m == nil {
			continue
		}
		le := math.Inf(1)
		if m[1] != "+Inf" {
			le, _ = strconv.ParseFloat(m[1], 64)
		}
		bs = append(bs, bucket{le, v - before[k]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].n
	prevLe, prevN := 0.0, 0.0
	for _, b := range bs {
		if b.n >= rank {
			if math.IsInf(b.le, 1) {
				return prevLe
			}
			return prevLe + (b.le-prevLe)*(rank-prevN)/(b.n-prevN)
		}
		prevLe, prevN = b.le, b.n
	}
	return prevLe
}

// rawConfirms publishes persistent messages one by one at rate a second
// for d, straight to a durable quorum queue of its own through the stack's
// exchange (as rawPublish does), and returns the p50 and p99 of the time
// from each publish to its confirm, in ms: what the broker itself takes to
// confirm at that rate, under whatever else the machine runs meanwhile.
func rawConfirms(s *stack, rate float64, d time.Duration) (p50, p99 float64, err error) {
	conn, err := amqp.Dial(benchCfg.amqpURL)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	if err := ch.Confirm(false); err != nil {
		return 0, 0, err
	}
	raw := s.names.NotifyQueue + ".rawconfirms"
	if _, err := ch.QueueDeclare(raw, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		return 0, 0, err
	}
	defer ch.QueueDelete(raw, false, false, false)
	if err := ch.QueueBind(raw, "bench.rawconfirms", s.names.Exchange, false, nil); err != nil {
		return 0, 0, err
	}
	ctx := context.Background()
	body := []byte(`{"id":"evt_bench","type":"order.paid","occurred_at":"2026-12-01T08:00:00Z","tenant_id":"acme","data":` + orderJSON + `}`)
	type sent struct {
		at time.Time
		dc *amqp.DeferredConfirmation
	}
	// Confirms are awaited in order by another goroutine, so that a slow
	// one does not delay the next publish: the schedule is kept, as the
	// relay keeps claiming while its batches wait.
	pending := make(chan sent, int(rate*d.Seconds())+16)
	lats := make(chan []float64, 1)
	go func() {
		var ms []float64
		for p := range pending {
			if ok, err := p.dc.WaitContext(ctx); err == nil && ok {
				ms = append(ms, float64(time.Since(p.at).Microseconds())/1000)
			}
		}
		lats <- ms
	}()
	every := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for next := start; time.Since(start) < d; next = next.Add(every) {
		time.Sleep(time.Until(next))
		at := time.Now()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, s.names.Exchange, "bench.rawconfirms", false, false,
			amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: "evt_bench", Type: "order.paid", Body: body, Timestamp: at})
		if err != nil {
			close(pending)
			<-lats
			return 0, 0, err
		}
		pending <- sent{at, dc}
	}
	close(pending)
	ms := <-lats
	if len(ms) == 0 {
		return 0, 0, fmt.Errorf("raw confirms: none confirmed")
	}
	sort.Float64s(ms)
	q := func(p float64) float64 { return ms[min(len(ms)-1, int(math.Ceil(p*float64(len(ms))))-1)] }
	return q(0.5), q(0.99), nil
}
