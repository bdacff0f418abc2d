package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/testenv"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// TestRedisMasterFailover: the api runs on a Redis Cluster of three
// masters with a replica each (REDIS_CLUSTER=true), checkouts keep coming,
// each key sent twice at once (a client's retry racing its first try), and
// a master dies (SIGKILL); its replica takes over its slots. In both
// DEDUP_FAILURE_MODEs every key ends paid with one order and one
// PaymentIntent, and the api answers again once the replica has taken
// over. What the clients saw during the failover window is logged
// (docs/operations.md, "Running in production").
func TestRedisMasterFailover(t *testing.T) {
	requireFailover(t)
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) { redisMasterFailover(t, mode) })
	}
}

func redisMasterFailover(t *testing.T, mode string) {
	cluster := testenv.StartRedisClusterWithReplicas(t, 3)
	s := setup(t, stack.Options{DedupFailureMode: mode, NoBackground: true, Env: map[string]map[string]string{
		"api": {"REDIS_CLUSTER": "true", "REDIS_URL": cluster.URL()},
	}})
	ctx := testCtx(t, 5*time.Minute)

	l := startDuplicateLoad(ctx, s, 4)
	eventually(t, time.Minute, func() bool { return l.paidCount() >= 20 }, "20 keys paid before the kill")

	masters, err := cluster.Masters(ctx)
	require.NoError(t, err)
	var master, replica string
	for m, r := range masters {
		if r != "" && (master == "" || m < master) {
			master, replica = m, r
		}
	}
	require.NotEmpty(t, replica, "a master with a replica: %v", masters)
	killedAt := time.Now()
	cluster.Kill(master)
	promotedAt, err := cluster.AwaitPromotion(ctx, replica, time.Minute)
	require.NoError(t, err)

	// Keep the load on until the api has answered nothing but final
	// answers for 5s, or a minute and a half has passed.
	recovered := l.awaitCalm(killedAt, 5*time.Second, 90*time.Second)
	atts, keys := l.stop(t)

	w := summarize(atts, killedAt)
	t.Logf("DEDUP_FAILURE_MODE=%s: replica promoted %s after the kill; answers from the kill on: %s",
		mode, promotedAt.Sub(killedAt).Round(10*time.Millisecond), w)
	require.True(t, recovered, "only final answers again within 90s of the kill: %s", w)
	require.Less(t, w.lastNonFinal, promotedAt.Sub(killedAt)+10*time.Second,
		"the api takes every key again within 10s of the promotion: %s", w)

	// One order and one PaymentIntent per key, whatever Redis did.
	require.Equal(t, len(keys), s.Orders(), "one order per key")
	for key, o := range keys {
		require.Equal(t, "paid", s.OrderStatus(o.ID), "key %s", key)
		require.Equal(t, 1, s.Charges(key, o.ID), "PaymentIntents for key %s", key)
	}
	require.Equal(t, len(keys), s.Stats().PaymentIntentsCreated, "no PaymentIntent beyond one per key")
}

// attempt is one HTTP answer the load got, with when it came.
type attempt struct {
	at     time.Time
	took   time.Duration
	status int
	code   string
}

// dupLoad sends checkouts under new keys from a few clients at once, each
// key twice concurrently and each copy retried until final.
type dupLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	atts   []attempt
	paid   map[string]*stack.Order
	errs   []error
}

func startDuplicateLoad(ctx context.Context, s *stack.Stack, clients int) *dupLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &dupLoad{cancel: cancel, paid: map[string]*stack.Order{}}
	c := s.Client()
	for w := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("redis-%d-%d", w, i)
				body := stack.TeeBody(key+"@example.com", 1)
				keyCtx, cancelKey := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
				var twin sync.WaitGroup
				for range 2 {
					twin.Add(1)
					go func() {
						defer twin.Done()
						l.untilFinal(keyCtx, c, key, body)
					}()
				}
				twin.Wait()
				cancelKey()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *dupLoad) untilFinal(ctx context.Context, c *stack.Client, key string, body stack.Body) {
	for {
		start := time.Now()
		r := c.Checkout(ctx, key, body)
		l.mu.Lock()
		l.atts = append(l.atts, attempt{at: time.Now(), took: time.Since(start), status: r.Status, code: r.Code})
		switch {
		case !r.Final():
		case r.Status == 201 && r.Order != nil && r.Order.Status == "paid":
			if o, ok := l.paid[key]; ok && o.ID != r.Order.ID {
				l.errs = append(l.errs, fmt.Errorf("key %s: two orders, %s and %s", key, o.ID, r.Order.ID))
			}
			l.paid[key] = r.Order
		default:
			l.errs = append(l.errs, fmt.Errorf("key %s: %s %s", key, r, r.Body))
		}
		l.mu.Unlock()
		if r.Final() {
			return
		}
		select {
		case <-ctx.Done():
			l.mu.Lock()
			l.errs = append(l.errs, fmt.Errorf("key %s: no final answer: %w", key, ctx.Err()))
			l.mu.Unlock()
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (l *dupLoad) paidCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.paid)
}

// awaitCalm waits until the last calm of answers since from were all
// final (a 409 in use counts as final here: it is the twin's lease), or
// max has passed since from; it reports whether the calm came.
func (l *dupLoad) awaitCalm(from time.Time, calm, max time.Duration) bool {
	for time.Since(from) < max {
		time.Sleep(200 * time.Millisecond)
		if time.Since(from) < calm {
			continue
		}
		l.mu.Lock()
		quiet := true
		for i := len(l.atts) - 1; i >= 0 && time.Since(l.atts[i].at) < calm; i-- {
			if disrupted(l.atts[i]) {
				quiet = false
				break
			}
		}
		l.mu.Unlock()
		if quiet {
			return true
		}
	}
	return false
}

// disrupted reports whether a is an answer a healthy api does not give:
// anything but a final answer or the twin's 409 in use.
func disrupted(a attempt) bool {
	return a.status != 201 && !(a.status == 409 && a.code == "idempotency_key_in_use")
}

func (l *dupLoad) stop(t *testing.T) ([]attempt, map[string]*stack.Order) {
	t.Helper()
	l.cancel()
	l.wg.Wait()
	require.Empty(t, l.errs)
	return l.atts, l.paid
}

// window is what clients saw from a moment on.
type window struct {
	byStatus                    map[string]int
	firstNonFinal, lastNonFinal time.Duration // after the moment; 0 when none
	total                       int
	slowest                     time.Duration // the longest answer that came after the moment
	slowestAt                   time.Duration // when it came
}

func summarize(atts []attempt, from time.Time) window {
	w := window{byStatus: map[string]int{}}
	for _, a := range atts {
		if a.at.Before(from) {
			continue
		}
		w.total++
		if a.took > w.slowest {
			w.slowest, w.slowestAt = a.took, a.at.Sub(from)
		}
		name := fmt.Sprint(a.status)
		if a.code != "" {
			name += " " + a.code
		}
		if a.status == 0 {
			name = "no answer"
		}
		w.byStatus[name]++
		if disrupted(a) {
			d := a.at.Sub(from)
			if w.firstNonFinal == 0 {
				w.firstNonFinal = d
			}
			w.lastNonFinal = d
		}
	}
	return w
}

func (w window) String() string {
	names := make([]string, 0, len(w.byStatus))
	for n := range w.byStatus {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s: %d", n, w.byStatus[n])
	}
	return fmt.Sprintf("%d answers (%s); disrupted from %s to %s after the kill; slowest answer %s (came %s after the kill)",
		w.total, strings.Join(parts, ", "), w.firstNonFinal.Round(10*time.Millisecond), w.lastNonFinal.Round(10*time.Millisecond),
		w.slowest.Round(10*time.Millisecond), w.slowestAt.Round(10*time.Millisecond))
}
