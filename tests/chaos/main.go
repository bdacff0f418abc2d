// Command chaos runs N checkouts against a full stack (package
// tests/e2e/stack) from concurrent clients while it injects faults at
// random: Stripe failures, delays and dropped answers, gateway 504s, SIGKILL
// and restart of the api, the dispatcher and the worker, and cut or stalled
// connections to Postgres, Redis and RabbitMQ, and Stripe's own semantics:
// 500s stored under the idempotency key (replayed to every retry), some of
// them rolled forward (executed anyway). Outside actors and time act too
// (CONTRACT.md v4): the worker is restarted five times with a backlog in its
// queue, support cancels open PaymentIntents (each cancellation_reason) and
// refunds paid ones in Stripe's Dashboard, and Stripe is down, GETs
// included, for longer than PAYMENT_UNKNOWN_AFTER. From the start, the mail server is
// down for -mail-outage (5m, longer than the four minutes after which the
// sender used to give an email up): it answers 451 to every message for the
// first half, and refuses connections for the second. Then it turns the faults off, lets
// every client retry its key until it gets a final answer, waits for the
// outbox and the notifications to drain, and checks every invariant: at
// most one money-moving PaymentIntent per order (read from the emulator's
// own state), the order's status equal to Stripe's, one order per key, one
// email per paid order and no notification failed, every 201 a client saw
// is a paid order, no key left unfinished, no outbox row unpublished,
// every order in a final status, each paid order's amount_refunded equal to
// what Stripe refunded of it, no event in the dead-letter queue. It prints a table and, as its last line,
// "chaos: R requests, F faults, V violations", and exits 1 on a violation.
//
//	go run ./tests/chaos -n 2000
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

func main() {
	n := flag.Int("n", 2000, "number of checkouts (distinct idempotency keys)")
	clients := flag.Int("c", 24, "concurrent clients")
	dup := flag.Float64("dup", 0.3, "share of keys sent by a second, concurrent client as a duplicate retry")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "random seed")
	mailOutage := flag.Duration("mail-outage", 5*time.Minute,
		"how long the mail server is down from the start: 451 to every message, then connections refused (0: no outage)")
	flag.Parse()

	r := &runner{}
	code := r.run(func() int { return chaos(r, *n, *clients, *dup, *seed, *mailOutage) })
	os.Exit(code)
}

// runner is the stack.TB of a program: cleanups run at the end, Fatalf
// stops the run.
type runner struct {
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

type fatal struct{ msg string }

func (r *runner) Helper()                         {}
func (r *runner) Cleanup(f func())                { r.mu.Lock(); r.cleanups = append(r.cleanups, f); r.mu.Unlock() }
func (r *runner) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (r *runner) Failed() bool                    { r.mu.Lock(); defer r.mu.Unlock(); return r.failed }
func (r *runner) Fatalf(format string, args ...any) {
	r.fail()
	panic(fatal{fmt.Sprintf(format, args...)})
}
func (r *runner) fail() { r.mu.Lock(); r.failed = true; r.mu.Unlock() }

// run calls f, then the cleanups in reverse order, also after a Fatalf or
// an interrupt.
func (r *runner) run(f func() int) (code int) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "chaos: interrupted; cleaning up")
		r.fail()
		r.cleanup()
		os.Exit(130)
	}()
	defer func() {
		if p := recover(); p != nil {
			if f, ok := p.(fatal); ok {
				fmt.Fprintln(os.Stderr, "chaos:", f.msg)
				code = 2
			} else {
				r.fail()
				r.cleanup()
				panic(p)
			}
		}
		r.cleanup()
	}()
	return f()
}

func (r *runner) cleanup() {
	r.mu.Lock()
	cs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// keyState is what the clients saw for one key.
type keyState struct {
	key    string
	mu     sync.Mutex
	finals []stack.Result
	// challenged: the customer has played the 3D Secure challenge of the
	// key's 202.
	challenged bool
}

// tally counts client answers by kind and faults by kind.
type tally struct {
	mu sync.Mutex
	m  map[string]int
}

func (t *tally) add(k string, n int) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]int{}
	}
	t.m[k] += n
	t.mu.Unlock()
}

func (t *tally) sorted() ([]string, map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.m))
	m := make(map[string]int, len(t.m))
	for k, v := range t.m {
		keys = append(keys, k)
		m[k] = v
	}
	sort.Strings(keys)
	return keys, m
}

func answerKind(r stack.Result) string {
	switch {
	case r.Status == 0:
		return "no answer"
	case r.Status == 201 && r.Replayed:
		return "201 replayed"
	case r.Status == 201:
		return "201 new"
	case r.Code != "":
		return fmt.Sprintf("%d %s", r.Status, r.Code)
	}
	return fmt.Sprintf("%d", r.Status)
}

// oldGiveUp is how long the sender used to retry an email before it marked
// it failed for good: eight tries, 2s, 4s ... 128s apart.
const oldGiveUp = (2 + 4 + 8 + 16 + 32 + 64 + 128) * time.Second

// mailOutage takes the stack's mail server down for d: it answers 451 to
// every message for the first half, and refuses connections for the
// second. It returns what went wrong talking to the sink, if anything.
func mailOutage(s *stack.Stack, d time.Duration, restored *time.Time) (err error) {
	defer func() {
		if p := recover(); p != nil { // the stack's Fatalf, off the main goroutine
			err = fmt.Errorf("mail outage: %v", p)
		}
	}()
	if d <= 0 {
		return nil
	}
	s.MailOutage("reject", 451)
	time.Sleep(d / 2)
	s.MailOutage("refuse", 0)
	time.Sleep(d - d/2)
	s.MailRestore()
	*restored = time.Now()
	return nil
}

func chaos(r *runner, n, clients int, dupShare float64, seed uint64, outage time.Duration) int {
	start := time.Now()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	fmt.Fprintf(os.Stderr, "chaos: seed %d, building binaries\n", seed)
	binDir, err := os.MkdirTemp("", "chaos-bin-")
	if err != nil {
		r.Fatalf("%v", err)
	}
	r.Cleanup(func() { os.RemoveAll(binDir) })
	if err := stack.Build(binDir); err != nil {
		r.Fatalf("%v", err)
	}
	logDir, _ := os.MkdirTemp("", "chaos-logs-")
	s := stack.Start(r, stack.Options{
		BinDir:           binDir,
		LogDir:           logDir,
		Lease:            2 * time.Second,
		StripeTimeout:    time.Second,
		StripeMaxElapsed: 3 * time.Second,
		GatewayTimeout:   1500 * time.Millisecond,
		// The emulator delivers its signed webhooks to the api; the
		// webhook faults below duplicate, reorder, delay and drop them.
		Webhooks: true,
		// A Stripe outage longer than PAYMENT_UNKNOWN_AFTER (stripeOutage)
		// moves orders to payment_unknown within the run.
		Env: map[string]map[string]string{
			"api":    {"PAYMENT_UNKNOWN_AFTER": unknownAfter.String()},
			"worker": {"PAYMENT_UNKNOWN_AFTER": unknownAfter.String()},
		},
	})
	fmt.Fprintf(os.Stderr, "chaos: stack up (logs in %s); %d checkouts, %d clients\n", logDir, n, clients)

	// The mail server is down while the first orders are paid: their
	// emails wait, retried, for longer than the sender used to try.
	outageDone := make(chan error, 1)
	mailDown := time.Now()
	var mailBack time.Time // set before outageDone is sent on
	go func() { outageDone <- mailOutage(s, outage, &mailBack) }()
	if outage > 0 {
		fmt.Fprintf(os.Stderr, "chaos: mail server down for %s (451, then connections refused)\n", outage)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("chaos-%d-", seed%1_000_000)
	keys := make([]*keyState, n)
	for i := range keys {
		keys[i] = &keyState{key: fmt.Sprintf("%s%d", prefix, i)}
	}

	var (
		answers  tally
		faults   tally
		layers   tally
		requests atomic.Int64
	)
	// The duplicate counters live in the processes: read them before every
	// kill and at the end, and add up.
	layerSnapshot := func(url, name, label string, values ...string) {
		for _, v := range values {
			if x, err := stack.Metric(url, name, fmt.Sprintf(`%s="%s"`, label, v)); err == nil {
				layers.add(v, int(x))
			}
		}
	}
	apiLayers := func() {
		layerSnapshot(s.APIURL+"/metrics", "checkout_idempotency_duplicates_total", "layer", "redis", "postgres")
		if x, err := stack.Metric(s.APIURL+"/metrics", "checkout_stripe_webhooks_total", `outcome="duplicate"`); err == nil {
			layers.add("inbox (stripe webhooks)", int(x))
		}
	}
	workerLayer := func() {
		if x, err := stack.Metric(s.WorkerOps+"/metrics", "checkout_inbox_duplicates_total", "consumer", "notify.order_paid"); err == nil {
			layers.add("inbox (worker)", int(x))
		}
	}

	// Clients: each takes the next key and retries it until a final
	// answer; a share of the keys gets a second client at the same time.
	// A 202 (3D Secure) is followed by the customer's challenge, once per
	// key, passed or failed at random; the webhooks (or the reconciler)
	// settle the order.
	send := func(k *keyState, body stack.Body) {
		c := s.Client()
		for ctx.Err() == nil {
			res := c.Checkout(ctx, k.key, body)
			requests.Add(1)
			answers.add(answerKind(res), 1)
			if res.Final() {
				k.mu.Lock()
				k.finals = append(k.finals, res)
				challenge := res.Status == 202 && !k.challenged
				k.challenged = k.challenged || challenge
				k.mu.Unlock()
				if challenge {
					customer3DS(s, res, rand.IntN(4) != 0, &answers)
				}
				return
			}
			time.Sleep(time.Duration(100+rand.IntN(200)) * time.Millisecond)
		}
	}
	next := atomic.Int64{}
	var (
		wg      sync.WaitGroup
		started atomic.Int64
	)
	// Mostly cards that pay, then a decline, a 3D Secure card (202; the
	// customers authenticate, or fail to, after the run) and a payment
	// method Stripe does not know (402 payment_rejected).
	methods := []string{"pm_card_visa", "pm_card_visa", "pm_card_visa", "pm_card_visa", "pm_card_visa", "pm_card_visa",
		"pm_card_chargeDeclined", "pm_card_chargeDeclined", "pm_card_authenticationRequired", "pm_card_unknownToStripe"}
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				k := keys[i]
				body := stack.TeeBody(fmt.Sprintf("buyer%d@example.com", i), 1+i%3)
				body.PaymentMethod = methods[i%len(methods)]
				started.Add(1)
				var dw sync.WaitGroup
				if rand.Float64() < dupShare {
					answers.add("(duplicate clients)", 1)
					dw.Add(1)
					go func() {
						defer dw.Done()
						time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
						send(k, body)
					}()
				}
				send(k, body)
				dw.Wait()
			}
		}()
	}

	// Faults, while keys are still being started.
	proxies := []*stack.Proxy{s.Redis, s.PGAPI, s.PGDispatcher, s.PGWorker, s.AMQPDispatcher, s.AMQPWorker}
	restart := func(p *stack.Process) {
		if err := p.Restart(); err != nil {
			r.Fatalf("restart %s: %v", p.Name, err)
		}
	}
	var backlogDone, stripeDownDone bool
	for started.Load() < int64(n) && ctx.Err() == nil {
		time.Sleep(time.Duration(200+rng.IntN(500)) * time.Millisecond)
		k := rng.IntN(20)
		// Each of these happens at least once, halfway through at the
		// latest.
		switch half := started.Load() >= int64(n/2); {
		case half && !backlogDone:
			k = 15
		case half && !stripeDownDone:
			k = 16
		}
		switch k {
		case 0:
			s.Fault(stripeemu.Fault{Kind: stripeemu.FaultFail, Count: 1 + rng.IntN(3), Status: []int{500, 503, 429}[rng.IntN(3)]})
			faults.add("stripe 5xx/429", 1)
		case 1:
			// Slower than the gateway: the client gets a 504, the charge
			// goes through.
			s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1 + rng.IntN(2), After: 1800 * time.Millisecond})
			faults.add("stripe slow answer (gateway 504)", 1)
		case 2:
			s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 1500 * time.Millisecond})
			faults.add("stripe timeout, in flight (409)", 1)
		case 3:
			s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDrop, Count: 1})
			faults.add("stripe dropped answer", 1)
		case 4:
			apiLayers()
			s.API.Kill()
			faults.add("SIGKILL api", 1)
			restart(s.API)
		case 5:
			s.Dispatcher.Kill()
			faults.add("SIGKILL dispatcher", 1)
			restart(s.Dispatcher)
		case 6:
			workerLayer()
			s.Worker.Kill()
			faults.add("SIGKILL worker", 1)
			restart(s.Worker)
		case 7, 8:
			p := proxies[rng.IntN(len(proxies))]
			p.Cut()
			faults.add("cut "+p.Name, 1)
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
			if err := p.Restore(); err != nil {
				r.Fatalf("restore %s: %v", p.Name, err)
			}
		case 9:
			p := proxies[rng.IntN(len(proxies))]
			if err := p.Stall(); err != nil {
				r.Fatalf("%v", err)
			}
			faults.add("stall "+p.Name, 1)
			time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond)
			p.Heal()
		case 10:
			// A gateway that gives up early on a request that is not slow.
			s.Gateway.SetTimeout(time.Duration(20+rng.IntN(60)) * time.Millisecond)
			faults.add("gateway timeout spike", 1)
			time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
			s.Gateway.SetTimeout(1500 * time.Millisecond)
		case 11:
			// Stripe stores a 500 under the key: resending it can never
			// succeed; the saga reconciles (search, GET) instead.
			op := []string{stripeemu.OpPICreate, stripeemu.OpPIConfirm}[rng.IntN(2)]
			s.Fault(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: op, Count: 1 + rng.IntN(2)})
			faults.add("stripe stored 500 ("+op+")", 1)
		case 12:
			// ... and executes the request anyway (remediation rolls it
			// forward): the object exists though the answer was a 500.
			op := []string{stripeemu.OpPICreate, stripeemu.OpPIConfirm}[rng.IntN(2)]
			s.Fault(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: op, Count: 1 + rng.IntN(2),
				RollForward: stripeemu.RollForwardAfter(time.Duration(rng.IntN(200)) * time.Millisecond)})
			faults.add("stripe stored 500 rolled forward ("+op+")", 1)
		case 13:
			// Stripe delivers events at least once and in no particular
			// order (https://docs.stripe.com/webhooks#event-ordering).
			if rng.IntN(2) == 0 {
				s.HookFault(stripeemu.HookFault{Kind: stripeemu.HookDuplicate, Count: 5 + rng.IntN(20)})
				faults.add("webhooks duplicated", 1)
			} else {
				s.HookFault(stripeemu.HookFault{Kind: stripeemu.HookShuffle, Count: 1 + rng.IntN(3), Window: 2 + rng.IntN(5)})
				faults.add("webhooks reordered", 1)
			}
		case 14:
			if rng.IntN(2) == 0 {
				s.HookFault(stripeemu.HookFault{Kind: stripeemu.HookDelay, Count: 1 + rng.IntN(5), Delay: time.Duration(200+rng.IntN(1800)) * time.Millisecond})
				faults.add("webhooks delayed", 1)
			} else {
				s.HookFault(stripeemu.HookFault{Kind: stripeemu.HookDropFirst, Count: 1 + rng.IntN(5)})
				faults.add("webhooks dropped (first attempt)", 1)
			}
		case 17:
			// A confirm answered with a stored 500 that Stripe executes a
			// few seconds later, and the next confirm declined: Stripe
			// keeps a declined PaymentIntent open, so the late confirm
			// charges it unless the order's exit canceled it first.
			s.Fault(stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPIConfirm, Count: 1,
				RollForward: stripeemu.RollForwardAfter(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)})
			s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDecline, Op: stripeemu.OpPIConfirm, Count: 1})
			faults.add("stripe declined retry behind a stored 500 rolled forward", 1)
		case 15:
			// A worker restarted five times with a backlog: deliveries
			// handed back unprocessed must not count toward the
			// dead-letter limit (CONTRACT.md v4).
			workerLayer()
			workerBacklog(r, s)
			backlogDone = true
			faults.add("worker restarted 5 times with a backlog", 1)
		case 16:
			// Stripe down, GETs included, for longer than
			// PAYMENT_UNKNOWN_AFTER: orders in flight become
			// payment_unknown and are reconciled once it is back.
			faults.add(stripeOutage(s), 1)
			stripeDownDone = true
		case 18:
			if reason, ok := dashboardCancel(s, rng); ok {
				faults.add("dashboard cancel ("+reason+")", 1)
			}
		case 19:
			if dashboardRefund(s, rng) {
				faults.add("dashboard refund", 1)
			}
		default:
			// Quiet period.
		}
	}

	// A short run may start every key before the halfway mark: the
	// backlog and the outage happen anyway, while clients still retry.
	if !backlogDone {
		workerLayer()
		workerBacklog(r, s)
		faults.add("worker restarted 5 times with a backlog", 1)
	}
	if !stripeDownDone {
		faults.add(stripeOutage(s), 1)
	}
	// Support cancels, in the Dashboard, a 3D Secure payment whose customer
	// has not authenticated yet, once with each cancellation_reason: the
	// order must end, canceled or payment_failed (CONTRACT.md v4).
	for i, reason := range []string{"duplicate", "fraudulent", "requested_by_customer", "abandoned"} {
		k := &keyState{key: fmt.Sprintf("%sdashboard-%d", prefix, i), challenged: true}
		body := stack.TeeBody(fmt.Sprintf("dashboard%d@example.com", i), 1)
		body.PaymentMethod = "pm_card_authenticationRequired"
		send(k, body)
		keys = append(keys, k)
		if len(k.finals) == 1 && k.finals[0].Status == 202 && k.finals[0].Order != nil &&
			stripeAPI(s, "/v1/payment_intents/"+k.finals[0].Order.Payment.PaymentIntentID+"/cancel",
				url.Values{"cancellation_reason": {reason}}) == http.StatusOK {
			faults.add("dashboard cancel of a 3D Secure payment ("+reason+")", 1)
		}
	}
	// And support acts in the Dashboard a few times whatever the draws:
	// refunds of paid orders, cancels of PaymentIntents still open (3D
	// Secure ones waiting for their customer, if any).
	for range 3 {
		if dashboardRefund(s, rng) {
			faults.add("dashboard refund", 1)
		}
		if reason, ok := dashboardCancel(s, rng); ok {
			faults.add("dashboard cancel ("+reason+")", 1)
		}
	}

	// Quiesce: faults off, every link and process back, clients finish.
	fmt.Fprintf(os.Stderr, "chaos: %d keys started after %s; faults off, quiescing\n", n, time.Since(start).Round(time.Second))
	s.ClearFaults()
	s.ClearHookFaults()
	s.Gateway.SetTimeout(5 * time.Second)
	for _, p := range proxies {
		p.Heal()
		if err := p.Restore(); err != nil {
			r.Fatalf("restore %s: %v", p.Name, err)
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		r.Fatalf("clients did not finish: %v", ctx.Err())
	}
	if err := <-outageDone; err != nil {
		r.Fatalf("%v", err)
	}
	if outage > 0 {
		fmt.Fprintf(os.Stderr, "chaos: mail server back after %s down\n", mailBack.Sub(mailDown).Round(time.Second))
	}
	// Most customers of 3D Secure checkouts played their challenge during
	// the run (customer3DS); the rest play it now, every other one failing
	// it. The webhooks (resent after a drop or a killed api) or the
	// worker's reconciler settle the orders.
	var actionErr error
	q, err := s.DB.Query(context.Background(), `SELECT payment_intent_id FROM orders WHERE status = 'requires_action' ORDER BY id`)
	if err != nil {
		r.Fatalf("%v", err)
	}
	var waiting []string
	for q.Next() {
		var pi string
		if err := q.Scan(&pi); err != nil {
			r.Fatalf("%v", err)
		}
		waiting = append(waiting, pi)
	}
	q.Close()
	for i, pi := range waiting {
		if err := s.TryAuthenticate(pi, i%2 == 0); err == nil {
			answers.add("(3D Secure played after the run)", 1)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		n := s.Count(`SELECT count(*) FROM orders WHERE status = 'requires_action'`)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			actionErr = fmt.Errorf("%d orders still in requires_action a minute after their customers authenticated", n)
			break
		}
	}
	quiesceErr := errors.Join(actionErr, s.Quiesce(2*time.Minute))
	// PaymentIntents that Stripe rolled forward after the saga's search are
	// canceled by the worker's sweep (ORPHAN_SWEEP_INTERVAL=1s here).
	for deadline := time.Now().Add(30 * time.Second); s.Orphans() > 0 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
	apiLayers()
	workerLayer()

	violations, resends, canceledOrphans := check(s, keys, quiesceErr)
	hooks := s.Webhooks()
	stats := s.Stats()
	stripeReplays := 0
	stripe409 := 0
	for _, rq := range stats.Requests {
		if rq.Replayed {
			stripeReplays++
		}
		if rq.Status == 409 {
			stripe409++
		}
	}
	layers.add("stripe (replayed)", stripeReplays)
	layers.add("stripe (409 in flight)", stripe409)

	// The table.
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "checkouts (keys)\t%d\n", n)
	fmt.Fprintf(w, "HTTP requests sent\t%d\n", requests.Load())
	fmt.Fprintf(w, "orders\t%d (paid %d, payment_failed %d, of which 3D Secure %d)\n", s.Orders(),
		s.Count(`SELECT count(*) FROM orders WHERE status = 'paid'`),
		s.Count(`SELECT count(*) FROM orders WHERE status = 'payment_failed'`),
		s.Count(`SELECT count(*) FROM orders WHERE requires_action_at IS NOT NULL`))
	fmt.Fprintf(w, "webhook deliveries\t%d attempts of %d events\n", len(hooks.Attempts), len(hooks.Events))
	fmt.Fprintf(w, "PaymentIntents created\t%d (canceled orphans %d)\n", stats.PaymentIntentsCreated, canceledOrphans)
	fmt.Fprintf(w, "emails\t%d\n", len(s.Messages()))
	if outage > 0 {
		waited := s.Count(`SELECT count(*) FROM notifications WHERE status = 'sent' AND failing_since IS NOT NULL`)
		longest := s.Count(`SELECT coalesce(max(extract(epoch FROM sent_at - failing_since)), 0)::int FROM notifications WHERE status = 'sent'`)
		// The old rule's eighth and last try came oldGiveUp after the
		// first failure: an email whose first failure was longer than that
		// before the mail server came back was failed for good.
		old := s.Count(`SELECT count(*) FROM notifications WHERE failing_since < $1::timestamptz - make_interval(secs => $2)`,
			mailBack, oldGiveUp.Seconds())
		var lastSent time.Time
		if err := s.DB.QueryRow(context.Background(), `SELECT coalesce(max(sent_at), now()) FROM notifications WHERE failing_since IS NOT NULL`).Scan(&lastSent); err != nil {
			r.Fatalf("%v", err)
		}
		fmt.Fprintf(w, "mail outage\t%s (451, then connections refused); the last delayed email left %s after it ended\n", outage,
			lastSent.Sub(mailBack).Round(time.Second))
		fmt.Fprintf(w, "emails sent after temporary failures\t%d (longest wait %s)\n", waited, time.Duration(longest)*time.Second)
		fmt.Fprintf(w, "  of which the old rule failed for good\t%d (first failure more than %s, its 8 tries, before the mail came back)\n", old, oldGiveUp)
	}
	fmt.Fprintf(w, "gateway 504s\t%d\n", s.Gateway.Timeouts())
	fmt.Fprintf(w, "duration\t%s\n", time.Since(start).Round(time.Second))
	fmt.Fprintln(w, "\t")
	fmt.Fprintln(w, "answers seen by clients\tcount")
	ks, m := answers.sorted()
	for _, k := range ks {
		fmt.Fprintf(w, "  %s\t%d\n", k, m[k])
	}
	fmt.Fprintln(w, "\t")
	fmt.Fprintln(w, "faults injected\tcount")
	ks, m = faults.sorted()
	totalFaults := 0
	for _, k := range ks {
		fmt.Fprintf(w, "  %s\t%d\n", k, m[k])
		totalFaults += m[k]
	}
	fmt.Fprintln(w, "\t")
	fmt.Fprintln(w, "duplicates absorbed, by layer\tcount")
	ks, m = layers.sorted()
	for _, k := range ks {
		fmt.Fprintf(w, "  %s\t%d\n", k, m[k])
	}
	fmt.Fprintln(w, "\t")
	fmt.Fprintln(w, "invariant\tviolations")
	total := 0
	for _, v := range violations {
		fmt.Fprintf(w, "  %s\t%d\n", v.name, len(v.examples))
		total += len(v.examples)
	}
	fmt.Fprintln(w, "\t")
	fmt.Fprintf(w, "SMTP resends of one Message-ID\t%d\t(at-least-once: a worker killed between the server's 250 and its commit)\n", len(resends))
	w.Flush()
	for _, e := range resends {
		fmt.Printf("  resend: %s\n", e)
	}
	for _, v := range violations {
		for i, e := range v.examples {
			if i == 5 {
				fmt.Printf("  ... %d more\n", len(v.examples)-5)
				break
			}
			fmt.Printf("  %s: %s\n", v.name, e)
		}
	}
	fmt.Printf("chaos: %d requests, %d faults, %d violations\n", requests.Load(), totalFaults, total)
	if total > 0 {
		r.fail() // keep the logs
		return 1
	}
	os.RemoveAll(logDir)
	return 0
}

// violation is one invariant and the cases that break it.

type violation struct {
	name     string
	examples []string
}

// check verifies every invariant against the database, the emulator and
// the sink, and lists the SMTP resends apart.
//
// resends lists the orders whose one email (one Message-ID) reached the
// SMTP server more than once. SMTP has no transactions: a worker killed
// between the server's "250 OK" and its own commit of "sent" sends the same
// message again after its claim expires. That is the at-least-once half of
// the sender, made harmless by the deterministic Message-ID that receivers
// deduplicate on; it is reported, not counted as a violation.
func check(s *stack.Stack, keys []*keyState, quiesceErr error) (violations []*violation, resends []string, canceledOrphans int) {
	inv := func(name string) *violation { return &violation{name: name} }
	var (
		oneCharge   = inv("at most one money-moving PaymentIntent per order")
		asStripe    = inv("order status equals Stripe's")
		orphans     = inv("every other PaymentIntent of an order canceled")
		oneOrder    = inv("one order per key")
		oneEmail    = inv("one email per paid order")
		seen201     = inv("every 201 seen is a paid order")
		sameAnswer  = inv("one final answer per key")
		finished    = inv("no key left unfinished")
		unpublished = inv("no outbox row unpublished")
		quiet       = inv("quiescence reached")
		noneFailed  = inv("no notification failed")
		noMoney     = inv("no money moved for an order that is not paid")
	)
	if quiesceErr != nil {
		quiet.examples = append(quiet.examples, quiesceErr.Error())
	}
	msgs := s.Messages()
	byOrder := stack.IntentsByOrder(s.PaymentIntents())

	type keyRow struct{ recoveryPoint, orderID, orderStatus, pi string }
	rows := map[string]keyRow{}
	q, err := s.DB.Query(context.Background(), `
		SELECT k.key, k.recovery_point, coalesce(k.order_id, ''), coalesce(o.status, ''), coalesce(o.payment_intent_id, '')
		FROM idempotency_keys k LEFT JOIN orders o ON o.id = k.order_id`)
	if err != nil {
		panic(err)
	}
	for q.Next() {
		var k string
		var r keyRow
		if err := q.Scan(&k, &r.recoveryPoint, &r.orderID, &r.orderStatus, &r.pi); err != nil {
			panic(err)
		}
		rows[k] = r
	}
	q.Close()

	for _, k := range keys {
		row, ok := rows[k.key]
		switch {
		case len(k.finals) == 0:
			finished.examples = append(finished.examples, k.key+": no final answer")
			continue
		case !ok:
			if k.finals[0].Status == 201 {
				seen201.examples = append(seen201.examples, k.key+": a 201 but no key row")
			}
			continue
		case row.recoveryPoint != "finished":
			finished.examples = append(finished.examples, fmt.Sprintf("%s: at %s", k.key, row.recoveryPoint))
		}
		for _, f := range k.finals {
			if f.Status != k.finals[0].Status || string(f.Body) != string(k.finals[0].Body) {
				sameAnswer.examples = append(sameAnswer.examples, fmt.Sprintf("%s: %s vs %s", k.key, k.finals[0], f))
			}
			if f.Status == 201 && (f.Order == nil || f.Order.ID != row.orderID || !orders.Status(row.orderStatus).PaidOnce()) {
				seen201.examples = append(seen201.examples, fmt.Sprintf("%s: 201 for order %v, key's order %s is %q", k.key, f.Order, row.orderID, row.orderStatus))
			}
		}
		if row.orderID == "" {
			continue
		}
		pis := byOrder[row.orderID]
		if n := stack.MoneyMoving(pis); n > 1 {
			oneCharge.examples = append(oneCharge.examples, fmt.Sprintf("%s: order %s has %d money-moving PaymentIntents", k.key, row.orderID, n))
		}
		var mine *stack.PaymentIntent
		for i := range pis {
			switch {
			case pis[i].ID == row.pi:
				mine = &pis[i]
			case pis[i].Status == "canceled":
				canceledOrphans++
			default:
				orphans.examples = append(orphans.examples, fmt.Sprintf("%s: order %s: PaymentIntent %s is %s", k.key, row.orderID, pis[i].ID, pis[i].Status))
			}
		}
		switch {
		case orders.Status(row.orderStatus).PaidOnce() && (mine == nil || mine.Status != "succeeded"):
			asStripe.examples = append(asStripe.examples, fmt.Sprintf("%s: order %s paid, its PaymentIntent %v", k.key, row.orderID, mine))
		case !orders.Status(row.orderStatus).PaidOnce() && stack.MoneyMoving(pis) > 0:
			asStripe.examples = append(asStripe.examples, fmt.Sprintf("%s: order %s is %s but money moved", k.key, row.orderID, row.orderStatus))
		}
		if orders.Status(row.orderStatus).PaidOnce() {
			ids := stack.MessageIDsFor(msgs, row.orderID)
			if len(ids) != 1 {
				oneEmail.examples = append(oneEmail.examples, fmt.Sprintf("order %s: %d emails (distinct Message-IDs)", row.orderID, len(ids)))
			}
			for _, n := range ids {
				if n > 1 {
					resends = append(resends, fmt.Sprintf("order %s: the same email %d times", row.orderID, n))
				}
			}
		}
	}
	// Money nobody's order accounts for.
	for orderID, pis := range byOrder {
		if n := stack.MoneyMoving(pis); n > 1 && orderID != "" {
			oneCharge.examples = append(oneCharge.examples, fmt.Sprintf("order %s: %d money-moving PaymentIntents", orderID, n))
		}
	}
	if n := s.Count(`SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.order_id = o.id)`); n > 0 {
		oneOrder.examples = append(oneOrder.examples, fmt.Sprintf("%d orders without a key", n))
	}
	if n := s.Count(`SELECT count(*) FROM (SELECT order_id FROM idempotency_keys WHERE order_id IS NOT NULL GROUP BY order_id HAVING count(*) > 1) d`); n > 0 {
		oneOrder.examples = append(oneOrder.examples, fmt.Sprintf("%d orders shared by keys", n))
	}
	paidEmails := 0
	for _, m := range msgs {
		if strings.HasSuffix(m.Subject, " is paid") {
			paidEmails++
		}
	}
	if paid := s.Count(`SELECT count(*) FROM orders WHERE status = ANY($1)`, paidOnce()); paidEmails-len(resends) != paid {
		oneEmail.examples = append(oneEmail.examples, fmt.Sprintf("%d paid emails (%d resends) for %d paid orders", paidEmails, len(resends), paid))
	}
	if n := s.Count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'`); n > 0 {
		finished.examples = append(finished.examples, fmt.Sprintf("%d keys unfinished in Postgres", n))
	}
	if n := s.Unpublished(); n > 0 {
		unpublished.examples = append(unpublished.examples, fmt.Sprintf("%d rows", n))
	}
	// No net charge for an order that is not paid: every money-moving
	// PaymentIntent of such an order (which the lifecycle forbids) must
	// have been refunded in full.
	refunded := map[string]int64{}
	for _, rf := range s.Refunds() {
		if rf.Status == "succeeded" {
			refunded[rf.PaymentIntent] += rf.Amount
		}
	}
	unpaid, err := s.DB.Query(context.Background(), `SELECT id, status FROM orders WHERE NOT status = ANY($1)`, paidOnce())
	if err != nil {
		panic(err)
	}
	for unpaid.Next() {
		var id, status string
		if err := unpaid.Scan(&id, &status); err != nil {
			panic(err)
		}
		for _, pi := range byOrder[id] {
			if stack.MoneyMoving([]stack.PaymentIntent{pi}) > 0 {
				net := pi.Amount - refunded[pi.ID]
				stray := fmt.Sprintf("order %s (%s): PaymentIntent %s is %s, %d charged net", id, status, pi.ID, pi.Status, net)
				if net > 0 {
					noMoney.examples = append(noMoney.examples, stray)
				} else {
					fmt.Fprintln(os.Stderr, "chaos: refunded stray payment:", stray)
				}
			}
		}
	}
	unpaid.Close()
	// Every customer played the challenge: no order may still wait for it.
	settled := inv("every 3D Secure order settled")
	if n := s.Count(`SELECT count(*) FROM orders WHERE status = 'requires_action'`); n > 0 {
		settled.examples = append(settled.examples, fmt.Sprintf("%d orders still requires_action", n))
	}
	// A mail outage shorter than NOTIFY_RETRY_FOR fails no email.
	if n := s.Count(`SELECT count(*) FROM notifications WHERE status <> 'sent'`); n > 0 {
		noneFailed.examples = append(noneFailed.examples, fmt.Sprintf("%d notifications not sent (%d failed)", n,
			s.Count(`SELECT count(*) FROM notifications WHERE status = 'failed'`)))
	}
	// Every order ends (CONTRACT.md v4: a Dashboard cancel too); a paid
	// one shows what Stripe refunded of it, the Dashboard's refunds
	// included; no healthy event is dead-lettered.
	final := inv("every order in a final status")
	waiting := make([]string, 0, len(orders.Waiting()))
	for _, st := range orders.Waiting() {
		waiting = append(waiting, string(st))
	}
	if n := s.Count(`SELECT count(*) FROM orders WHERE status = ANY($1)`, waiting); n > 0 {
		final.examples = append(final.examples, fmt.Sprintf("%d orders still on the way to paid", n))
	}
	asRefunded := inv("amount_refunded equals Stripe's refunds")
	asRefunded.examples = refundsAsStripe(s, refunded)
	deadLetters := inv("no event dead-lettered")
	if n, err := rabbitmqtest.Ready(rabbitmqtest.URL(), s.Names.NotifyDLQ); err != nil || n > 0 {
		deadLetters.examples = append(deadLetters.examples, fmt.Sprintf("%s: %d messages (%v)", s.Names.NotifyDLQ, n, err))
	}
	// The worker records what it takes off the dead-letter queue in
	// dead_letters (where the table exists).
	if s.Count(`SELECT count(*) FROM pg_tables WHERE tablename = 'dead_letters'`) > 0 {
		if n := s.Count(`SELECT count(*) FROM dead_letters`); n > 0 {
			deadLetters.examples = append(deadLetters.examples, fmt.Sprintf("%d events recorded in dead_letters", n))
		}
	}
	return []*violation{oneCharge, asStripe, noMoney, orphans, oneOrder, oneEmail, noneFailed, seen201, sameAnswer, finished, unpublished, settled, quiet,
		final, asRefunded, deadLetters}, resends, canceledOrphans
}

// customer3DS plays the customer of a 202 requires_action answer: the 3D
// Secure challenge of its PaymentIntent at the emulator, passed or failed.
func customer3DS(s *stack.Stack, res stack.Result, succeed bool, answers *tally) {
	var o stack.Order
	if err := json.Unmarshal(res.Body, &o); err != nil || o.Payment.PaymentIntentID == "" {
		answers.add("(3D Secure answer without a PaymentIntent)", 1)
		return
	}
	if err := s.TryAuthenticate(o.Payment.PaymentIntentID, succeed); err != nil {
		answers.add("(3D Secure challenge refused)", 1)
		return
	}
	if succeed {
		answers.add("(3D Secure passed)", 1)
	} else {
		answers.add("(3D Secure failed)", 1)
	}
}

// unknownAfter is the stack's PAYMENT_UNKNOWN_AFTER: short, so that the
// run's Stripe outage outlasts it.
const unknownAfter = 5 * time.Second

// stripeOutage takes Stripe down, every request GETs included answered
// 503, for longer than PAYMENT_UNKNOWN_AFTER, then brings it back, and
// returns the fault's label. Other faults injected before are cleared
// with it.
func stripeOutage(s *stack.Stack) string {
	d := unknownAfter + 3*time.Second
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 503})
	time.Sleep(d)
	s.ClearFaults()
	return fmt.Sprintf("stripe outage %s (PAYMENT_UNKNOWN_AFTER %s)", d, unknownAfter)
}

// workerBacklog stops the worker while the clients go on paying, so that
// events wait in its queue, then starts it and kills it at once five
// times, as a crash loop or a rolling redeploy does, and starts it for
// good. Each start takes deliveries (NOTIFY_PREFETCH) that the kill hands
// back unprocessed.
func workerBacklog(r *runner, s *stack.Stack) {
	s.Worker.Stop()
	time.Sleep(2 * time.Second)
	for range 5 {
		if err := s.Worker.Start(); err != nil {
			r.Fatalf("start worker: %v", err)
		}
		s.Worker.Kill()
	}
	if err := s.Worker.Start(); err != nil {
		r.Fatalf("start worker: %v", err)
	}
}

// stripeAPI calls Stripe's API at the emulator as the Dashboard does:
// with the account's secret key and no idempotency key of ours. It returns
// Stripe's status; a refusal (a PaymentIntent no longer cancelable, a
// refund over what is left) is part of the run.
func stripeAPI(s *stack.Stack, path string, form url.Values) int {
	req, err := http.NewRequest(http.MethodPost, s.EmulatorURL+path, strings.NewReader(form.Encode()))
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer sk_test_123")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// dashboardCancel cancels, as support does in the Dashboard, a
// PaymentIntent still open (on its way to paid), with one of Stripe's
// cancellation reasons: POST /v1/payment_intents/{id}/cancel
// (https://docs.stripe.com/api/payment_intents/cancel). The order must
// follow through the same lifecycle (CONTRACT.md v4).
func dashboardCancel(s *stack.Stack, rng *rand.Rand) (string, bool) {
	var open []stack.PaymentIntent
	for _, pi := range s.PaymentIntents() {
		switch pi.Status {
		case "requires_payment_method", "requires_confirmation", "requires_action":
			open = append(open, pi)
		}
	}
	if len(open) == 0 {
		return "", false
	}
	pi := open[rng.IntN(len(open))]
	reason := []string{"duplicate", "fraudulent", "requested_by_customer", "abandoned"}[rng.IntN(4)]
	return reason, stripeAPI(s, "/v1/payment_intents/"+pi.ID+"/cancel", url.Values{"cancellation_reason": {reason}}) == http.StatusOK
}

// dashboardRefund refunds, as support does in the Dashboard, part of a
// succeeded PaymentIntent: POST /v1/refunds with payment_intent and amount
// (https://docs.stripe.com/api/refunds/create). The order must show it
// and count it against what the API may still refund (CONTRACT.md v4).
func dashboardRefund(s *stack.Stack, rng *rand.Rand) bool {
	var paid []stack.PaymentIntent
	for _, pi := range s.PaymentIntents() {
		if pi.Status == "succeeded" {
			paid = append(paid, pi)
		}
	}
	if len(paid) == 0 {
		return false
	}
	pi := paid[rng.IntN(len(paid))]
	amount := 100 + rng.Int64N(max(pi.Amount/2, 1))
	return stripeAPI(s, "/v1/refunds", url.Values{"payment_intent": {pi.ID}, "amount": {strconv.FormatInt(amount, 10)}}) == http.StatusOK
}

// paidOnce lists the statuses of an order that was paid: paid, or refunded
// from paid (orders.Status.PaidOnce), for a query's ANY($1).
func paidOnce() []string {
	var out []string
	for _, st := range orders.All() {
		if st.PaidOnce() {
			out = append(out, string(st))
		}
	}
	return out
}

// refundsAsStripe compares, for every order paid once, the
// amount_refunded of GET /v1/orders/{id} with what Stripe refunded of its
// PaymentIntent (refunded, succeeded refunds by PaymentIntent), the
// Dashboard's refunds included, and lists the orders where they differ.
func refundsAsStripe(s *stack.Stack, refunded map[string]int64) []string {
	q, err := s.DB.Query(context.Background(), `SELECT id, payment_intent_id FROM orders WHERE status = ANY($1)`, paidOnce())
	if err != nil {
		panic(err)
	}
	type row struct{ id, pi string }
	var rows []row
	for q.Next() {
		var r row
		if err := q.Scan(&r.id, &r.pi); err != nil {
			panic(err)
		}
		rows = append(rows, r)
	}
	q.Close()
	var out []string
	for _, r := range rows {
		req, _ := http.NewRequest(http.MethodGet, s.APIURL+"/v1/orders/"+r.id, nil)
		req.Header.Set("Authorization", "Bearer sk_test_acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out = append(out, fmt.Sprintf("order %s: %v", r.id, err))
			continue
		}
		var o struct {
			AmountRefunded int64 `json:"amount_refunded"`
		}
		err = json.NewDecoder(resp.Body).Decode(&o)
		resp.Body.Close()
		if err != nil || o.AmountRefunded != refunded[r.pi] {
			out = append(out, fmt.Sprintf("order %s: amount_refunded %d, Stripe refunded %d (%v)", r.id, o.AmountRefunded, refunded[r.pi], err))
		}
	}
	return out
}
