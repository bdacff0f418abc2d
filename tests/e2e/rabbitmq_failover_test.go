package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// requireFailover skips a test that starts clusters of real servers
// unless TEST_FAILOVER is set: make test-failover sets it (and .ci/run
// runs that target), make test does not.
func requireFailover(t *testing.T) {
	t.Helper()
	if os.Getenv("TEST_FAILOVER") == "" {
		t.Skip("set TEST_FAILOVER=1 (make test-failover): starts a cluster of real servers")
	}
}

// TestRabbitMQNodeAndLeaderLoss: the dispatcher and the worker run against
// a 3-node RabbitMQ cluster (AMQP_URL lists the three nodes; the queues are
// quorum queues), checkouts keep coming, and two nodes die in turn
// (SIGKILL), each while the others carry on:
//
//  1. node 1, which the dispatcher and the worker are connected to (the
//     first of their list) but which does not lead the queue: both
//     reconnect to node 2, and orders made after the kill are emailed
//     while node 1 is still down;
//  2. node 3, the notification queue's leader (node 1 is back by then):
//     the remaining members elect a new leader, and again orders made after
//     the kill are emailed while node 3 is down.
//
// At the end no event is lost and none applied twice: every order paid is
// emailed exactly once, with one PaymentIntent, and the outbox is empty.
// The publish and consume gaps around each kill are logged
// (docs/operations.md, "Running in production").
//
// With a single-node AMQP_URL the processes never leave node 1 and step 1
// fails (no order emailed while it is down); with a classic notification
// queue (on node 3) step 2 fails the same way.
func TestRabbitMQNodeAndLeaderLoss(t *testing.T) {
	requireFailover(t)
	cluster := rabbitmqtest.StartCluster(t, 3)
	n1, n2, n3 := cluster.Nodes[0], cluster.Nodes[1], cluster.Nodes[2]
	amqpURL := cluster.URL()
	if os.Getenv("TEST_FAILOVER_SINGLE_NODE_URL") != "" { // the check that the list is what saves it
		amqpURL = n1.URL
	}
	s := setup(t, stack.Options{AMQPURL: amqpURL, NoBackground: true})
	ctx := testCtx(t, 12*time.Minute)

	// The topology is declared through node 3, so that the queue's leader
	// is there (quorum queues start their leader on the declaring
	// client's node), apart from the node the processes will use.
	declareThrough(t, n3.URL, s.Names)
	leader, err := cluster.QueueLeader(s.Names.NotifyQueue)
	require.NoError(t, err)
	require.Equal(t, n3, leader)

	for _, p := range []*stack.Process{s.Dispatcher, s.Worker} {
		require.NoError(t, p.Start())
		t.Cleanup(p.Kill)
		require.True(t, connectedTo(p, n1), "%s connected to node 1, the first of its list", p.Name)
	}

	load := startLoad(ctx, s, 4)
	eventually(t, 2*time.Minute, func() bool { return emailedSince(s, time.Time{}) >= 10 }, "10 orders emailed before any kill")

	// 1. The node the processes use dies.
	kill1 := time.Now()
	n1.Kill()
	eventually(t, 2*time.Minute, func() bool { return emailedSince(s, kill1) >= 10 },
		"orders made after node 1 died emailed while it is down")
	for _, p := range []*stack.Process{s.Dispatcher, s.Worker} {
		require.True(t, connectedTo(p, n2), "%s reconnected to node 2", p.Name)
	}
	require.NoError(t, n1.Restart(3*time.Minute))
	require.NoError(t, cluster.AwaitOnline(3, 2*time.Minute))

	// 2. The queue's leader dies.
	leader, err = cluster.QueueLeader(s.Names.NotifyQueue)
	require.NoError(t, err)
	require.Equal(t, n3, leader, "node 3 still leads")
	kill2 := time.Now()
	n3.Kill()
	eventually(t, 2*time.Minute, func() bool { return emailedSince(s, kill2) >= 10 },
		"orders made after the leader died emailed while it is down")
	newLeader, err := cluster.QueueLeader(s.Names.NotifyQueue)
	require.NoError(t, err)
	require.NotEqual(t, n3, newLeader)

	paid := load.stop(t)
	require.NoError(t, s.Quiesce(2*time.Minute))

	// No event lost, none applied twice.
	ms := s.Messages()
	require.Equal(t, len(paid), s.Count(`SELECT count(*) FROM orders WHERE status = 'paid'`), "every order paid was answered 201 to its client")
	for key, o := range paid {
		require.Equal(t, "paid", s.OrderStatus(o.ID), "order %s", o.ID)
		require.Equal(t, 1, stack.EmailsFor(ms, o.ID), "emails for order %s (key %s)", o.ID, key)
		require.Equal(t, 1, s.Charges(key, o.ID), "PaymentIntents for order %s", o.ID)
	}
	require.Len(t, ms, len(paid), "no other email")
	require.Equal(t, 0, s.Unpublished())
	dups, _ := stack.Metric(s.WorkerOps+"/metrics", "checkout_inbox_duplicates_total")

	pub1, con1 := gaps(t, s, kill1)
	pub2, con2 := gaps(t, s, kill2)
	t.Logf("%d orders paid and emailed once each; %v redeliveries absorbed by the inbox", len(paid), dups)
	t.Logf("node of the processes killed: publish gap %s, consume gap %s", pub1, con1)
	t.Logf("queue leader killed:          publish gap %s, consume gap %s", pub2, con2)
}

// connectedTo reports whether p logged a connection to node n.
func connectedTo(p *stack.Process, n *rabbitmqtest.Node) bool {
	for _, line := range strings.Split(p.LogTail(1<<20), "\n") {
		if strings.Contains(line, `"msg":"rabbitmq: connected"`) && strings.Contains(line, `"node":"127.0.0.1:`+strconv.Itoa(n.Port)+`"`) {
			return true
		}
	}
	return false
}

// declareThrough declares names' topology through the node at url.
func declareThrough(t *testing.T, url string, names rabbitmq.Names) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, rabbitmq.Config{URL: url, Name: "test-declare",
		Setup: func(ch *amqp.Channel) error { return rabbitmq.DeclareTopology(ch, names) }})
	require.NoError(t, err)
	require.NoError(t, conn.Close())
}

// emailedSince counts the orders created after since whose email was sent.
func emailedSince(s *stack.Stack, since time.Time) int {
	return s.Count(`SELECT count(*) FROM orders o JOIN notifications n ON n.order_id = o.id
		WHERE o.created_at > $1 AND n.status = 'sent'`, since)
}

// gaps returns, around at, the longest pause in publishing (between two
// consecutive outbox publications) and in consuming (between two
// consecutive inbox rows) that spans at or starts after it, within the
// next two minutes.
func gaps(t *testing.T, s *stack.Stack, at time.Time) (publish, consume time.Duration) {
	t.Helper()
	q := func(table, col string) time.Duration {
		var secs float64
		err := s.DB.QueryRow(context.Background(), fmt.Sprintf(`
			SELECT coalesce(max(extract(epoch FROM gap)), 0) FROM (
				SELECT %[2]s - lag(%[2]s) OVER (ORDER BY %[2]s) AS gap, %[2]s AS t FROM %[1]s
				WHERE %[2]s BETWEEN $1::timestamptz - interval '10 seconds' AND $1::timestamptz + interval '2 minutes') g
			WHERE t > $1`, table, col), at).Scan(&secs)
		require.NoError(t, err)
		return time.Duration(secs * float64(time.Second)).Round(10 * time.Millisecond)
	}
	return q("outbox", "published_at"), q("inbox", "received_at")
}

// load is checkouts under new keys from a few clients at once, each retried
// with its key until final, until stop.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	paid   map[string]*stack.Order // by key
	errs   []error
}

func startLoad(ctx context.Context, s *stack.Stack, clients int) *load {
	ctx, cancel := context.WithCancel(ctx)
	l := &load{cancel: cancel, paid: map[string]*stack.Order{}}
	c := s.Client()
	for w := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("load-%d-%d", w, i)
				// A started key is finished even after stop: its order
				// must be counted.
				keyCtx, cancelKey := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
				rs, err := c.CheckoutUntilFinal(keyCtx, key, stack.TeeBody(key+"@example.com", 1), 100*time.Millisecond)
				cancelKey()
				l.mu.Lock()
				switch r := rs[len(rs)-1]; {
				case err != nil:
					l.errs = append(l.errs, err)
				case r.Status == 201 && r.Order != nil && r.Order.Status == "paid":
					l.paid[key] = r.Order
				default:
					l.errs = append(l.errs, fmt.Errorf("key %s: %s %s", key, r, r.Body))
				}
				l.mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	return l
}

// stop ends the load, waits for the checkouts in flight and returns the
// paid orders by key; any other outcome fails the test.
func (l *load) stop(t *testing.T) map[string]*stack.Order {
	t.Helper()
	l.cancel()
	l.wg.Wait()
	require.Empty(t, l.errs, "every checkout paid")
	return l.paid
}
