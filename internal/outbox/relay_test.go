package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/notify/smtpsink"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fixture bundles one test's database, topology and SMTP sink.
type fixture struct {
	db    *gorm.DB
	dbURL string
	names rabbitmq.Names
	sink  *smtpsink.Sink
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db, dbURL := pgtest.NewDB(t)
	names := rabbitmqtest.NewNames(t)
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	return &fixture{db: db, dbURL: dbURL, names: names, sink: sink}
}

// paidOrders inserts n paid orders, each with its order.created and
// order.paid events in the outbox, as checkout's transaction 2 leaves them.
func (f *fixture) paidOrders(t *testing.T, n int) []string {
	t.Helper()
	orderIDs := make([]string, n)
	require.NoError(t, postgres.WithTx(context.Background(), f.db, func(tx *gorm.DB) error {
		for i := range orderIDs {
			orderIDs[i] = ids.New("ord")
			if err := insertPaidOrder(tx, orderIDs[i]); err != nil {
				return err
			}
		}
		return nil
	}))
	return orderIDs
}

func insertPaidOrder(tx *gorm.DB, orderID string) error {
	now := time.Now().UTC()
	email := "buyer+" + orderID + "@example.com"
	if err := tx.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES (?, 'acme', 'paid', ?, 'usd', 2500, 'pm_card_visa', ?, ?)`, orderID, email, now, now).Error; err != nil {
		return err
	}
	order := map[string]any{"id": orderID, "status": "paid", "email": email, "currency": "usd", "amount_total": 2500}
	for _, typ := range []string{outbox.TypeOrderCreated, outbox.TypeOrderPaid} {
		if err := outbox.Add(context.Background(), tx, outbox.Event{Type: typ, TenantID: "acme", AggregateID: orderID, Data: order}); err != nil {
			return err
		}
	}
	return nil
}

// conn connects to the broker at url (the proxy's, or the real one).
func (f *fixture) conn(t *testing.T, url string) *rabbitmq.Conn {
	return rabbitmqtest.Dial(t, url, func(c *rabbitmq.Config) {
		c.Setup = func(ch *amqp.Channel) error { return rabbitmq.DeclareTopology(ch, f.names) }
	})
}

func (f *fixture) newRelay(t *testing.T, conn *rabbitmq.Conn, reg prometheus.Registerer) *outbox.Relay {
	t.Helper()
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange, ConfirmTimeout: 2 * time.Second})
	t.Cleanup(func() { pub.Close() })
	r, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{
		PollInterval: 200 * time.Millisecond, BatchSize: 50,
		MinRetry: 50 * time.Millisecond, MaxRetry: 200 * time.Millisecond, Registerer: reg,
	})
	require.NoError(t, err)
	return r
}

func (f *fixture) newService(t *testing.T, conn *rabbitmq.Conn) *notify.Service {
	t.Helper()
	svc, err := notify.NewService(f.db, conn, &notify.SMTPMailer{Addr: f.sink.Addr()}, notify.Config{
		Queue:  f.names.NotifyQueue,
		Sender: notify.SenderConfig{SweepInterval: 100 * time.Millisecond, MinRetry: 10 * time.Millisecond, MaxRetry: 100 * time.Millisecond},
	})
	require.NoError(t, err)
	return svc
}

// run runs loop until the test ends (or stop), then checks it returned nil.
func run(t *testing.T, loop func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitFor(t *testing.T, within time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, within, 20*time.Millisecond, fmt.Sprintf(format, args...))
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Raw(query, args...).Scan(&n).Error)
	return n
}

// requireExactlyOneEmailPerOrder waits until every order has one sent
// notification, then checks the end state with exact counts: no outbox row
// unpublished, one email per notification, no other email, an empty
// dead-letter queue.
func (f *fixture) requireExactlyOneEmailPerOrder(t *testing.T, conn *rabbitmq.Conn, orderIDs []string, within time.Duration) {
	t.Helper()
	waitFor(t, within, func() bool {
		return f.count(t, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == len(orderIDs)
	}, "%d notifications sent", len(orderIDs))
	// The relay marks a row published once the broker confirms it, which
	// can come after the consumer has already sent the email.
	waitFor(t, 10*time.Second, func() bool {
		return f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	}, "unpublished rows")
	require.Equal(t, 2*len(orderIDs), f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`))
	require.Equal(t, len(orderIDs), f.count(t, `SELECT count(*) FROM notifications`))
	require.Equal(t, len(orderIDs), f.count(t, `SELECT count(DISTINCT order_id) FROM notifications`))

	var ntf []struct{ ID, OrderID string }
	require.NoError(t, f.db.Raw(`SELECT id, order_id FROM notifications`).Scan(&ntf).Error)
	counts := f.sink.CountByMessageID()
	for _, n := range ntf {
		require.Equal(t, 1, counts[notify.MessageID(n.ID)], "emails for order %s", n.OrderID)
	}
	require.Len(t, counts, len(orderIDs), "no email without a notification")
	require.Equal(t, len(orderIDs), f.sink.Len(), "total emails")

	ch, err := conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	dlq, err := ch.QueueDeclarePassive(f.names.NotifyDLQ, true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, 0, dlq.Messages, "dead-lettered messages")
}

func TestRelayPublishesWithContractPropertiesAndMarksRows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	conn := f.conn(t, rabbitmqtest.URL())
	reg := prometheus.NewRegistry()
	relay := f.newRelay(t, conn, reg)
	orderID := f.paidOrders(t, 1)[0]

	var got atomic.Pointer[amqp.Delivery]
	c := rabbitmq.NewConsumer(conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyQueue}, func(_ context.Context, d amqp.Delivery) error {
		if d.Type == "order.paid" { // the queue takes order.created too
			got.Store(&d)
		}
		return nil
	})
	run(t, c.Run)
	run(t, relay.Run)
	waitFor(t, 10*time.Second, func() bool { return got.Load() != nil }, "order.paid delivered")

	var row struct {
		ID      string
		Payload string
	}
	require.NoError(t, f.db.Raw(`SELECT id, payload::text AS payload FROM outbox WHERE type = 'order.paid' AND aggregate_id = ?`, orderID).Scan(&row).Error)
	d := got.Load()
	require.Equal(t, row.ID, d.MessageId)
	require.Equal(t, "order.paid", d.Type)
	require.Equal(t, "order.paid", d.RoutingKey)
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, row.Payload, string(d.Body), "body is the stored payload byte for byte")

	waitFor(t, 5*time.Second, func() bool {
		return f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND attempts = 0`) == 2
	}, "both rows marked published")
	waitFor(t, 5*time.Second, func() bool {
		return metric(t, reg, "checkout_outbox_published_total") == 2 &&
			metric(t, reg, "checkout_outbox_pending") == 0
	}, "metrics: 2 published, 0 pending")
}

// metric is the value of the counter or gauge named name in reg (0 when
// absent).
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

func TestRelayDyingAfterConfirmBeforeMarkRepublishesAndStillSendsOneEmail(t *testing.T) {
	t.Parallel()
	f := setup(t)
	conn := f.conn(t, rabbitmqtest.URL())
	orderID := f.paidOrders(t, 1)[0]

	// First relay: publishes, gets the confirms, dies before its commit.
	crashing := f.newRelay(t, conn, nil)
	outbox.SetAfterConfirm(crashing, func(context.Context) error { return errors.New("killed after confirm") })
	claimed, err := crashing.RelayBatch(context.Background())
	require.Error(t, err)
	require.Equal(t, 2, claimed)
	require.Equal(t, 2, f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL AND attempts = 0`), "nothing marked")

	// A healthy relay publishes the same rows again, with the same ids.
	relay := f.newRelay(t, conn, nil)
	claimed, err = relay.RelayBatch(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, claimed)

	// The order's two events (the worker takes every order.* event) are
	// now twice in the queue.
	waitFor(t, 5*time.Second, func() bool { return f.ready(t, conn, f.names.NotifyQueue) == 4 }, "published twice")
	run(t, f.newService(t, conn).Run)
	f.requireExactlyOneEmailPerOrder(t, conn, []string{orderID}, 10*time.Second)
	require.Equal(t, 2, f.count(t, `SELECT count(*) FROM inbox`), "two deliveries of each event, one inbox record each")
	require.Equal(t, 2, f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND attempts = 0`), "marked once, no failure recorded")
	claimed, err = relay.RelayBatch(context.Background())
	require.NoError(t, err)
	require.Zero(t, claimed, "nothing left to publish")
}

func TestLateCommittingRowIsStillPublished(t *testing.T) {
	t.Parallel()
	f := setup(t)
	conn := f.conn(t, rabbitmqtest.URL())

	// A transaction takes its seq first and stays open...
	lateID := ids.New("ord")
	tx := f.db.Begin()
	require.NoError(t, tx.Error)
	defer tx.Rollback()
	require.NoError(t, insertPaidOrder(tx, lateID))

	// ...while later transactions commit and get published.
	early := f.paidOrders(t, 3)
	run(t, f.newRelay(t, conn, nil).Run)
	run(t, f.newService(t, conn).Run)
	waitFor(t, 10*time.Second, func() bool {
		return f.count(t, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == 3
	}, "early orders notified")

	require.NoError(t, tx.Commit().Error)
	f.requireExactlyOneEmailPerOrder(t, conn, append(early, lateID), 10*time.Second)
	var seqs []int64
	require.NoError(t, f.db.Raw(`SELECT seq FROM outbox WHERE aggregate_id = ? ORDER BY seq`, lateID).Scan(&seqs).Error)
	require.Less(t, seqs[0], int64(3), "the late row has a lower seq than rows published before it")
}

// failingPublisher nacks every message with one id and passes the rest on.
type failingPublisher struct {
	next   outbox.Publisher
	poison string
	tries  atomic.Int32
}

func (p *failingPublisher) Publish(ctx context.Context, msgs []rabbitmq.Message) []error {
	errs := make([]error, len(msgs))
	var pass []rabbitmq.Message
	var idx []int
	for i, m := range msgs {
		if m.MessageID == p.poison {
			p.tries.Add(1)
			errs[i] = rabbitmq.ErrNacked
			continue
		}
		pass = append(pass, m)
		idx = append(idx, i)
	}
	for j, err := range p.next.Publish(ctx, pass) {
		errs[idx[j]] = err
	}
	return errs
}

func TestPoisonedRowBacksOffWithoutBlockingTheRest(t *testing.T) {
	t.Parallel()
	f := setup(t)
	conn := f.conn(t, rabbitmqtest.URL())
	orderIDs := f.paidOrders(t, 20)
	var poison string
	require.NoError(t, f.db.Raw(`SELECT id FROM outbox ORDER BY seq LIMIT 1`).Scan(&poison).Error)

	pub := &failingPublisher{next: rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange}), poison: poison}
	reg := prometheus.NewRegistry()
	relay, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{
		PollInterval: 10 * time.Millisecond, BatchSize: 7, MinRetry: 200 * time.Millisecond, MaxRetry: time.Hour, Registerer: reg,
	})
	require.NoError(t, err)
	stop := run(t, relay.Run)
	waitFor(t, 10*time.Second, func() bool {
		return f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`) == 2*len(orderIDs)-1
	}, "every other row published")
	waitFor(t, 10*time.Second, func() bool { return pub.tries.Load() >= 3 }, "poisoned row retried")
	stop()

	var row struct {
		Attempts  int
		LastError string
		Delay     float64
	}
	require.NoError(t, f.db.Raw(`SELECT attempts, last_error, extract(epoch FROM next_attempt_at - now())::float8 AS delay
		FROM outbox WHERE id = ?`, poison).Scan(&row).Error)
	require.Equal(t, int(pub.tries.Load()), row.Attempts)
	require.Contains(t, row.LastError, "nacked")
	// 200ms·2^(n-1): after 3+ failures the next try is at least 400ms away,
	// so with a 10ms poll it did not loop hot.
	require.Greater(t, row.Delay, 0.2)
	require.LessOrEqual(t, pub.tries.Load(), int32(5), "backoff, not a hot loop")
	require.Equal(t, float64(row.Attempts), metric(t, reg, "checkout_outbox_publish_failures_total"))
}

func TestTwoRelaysAndTwoWorkersOnAThousandEventsSendOneEmailPerOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderIDs := f.paidOrders(t, 1000)
	for range 2 {
		conn := f.conn(t, rabbitmqtest.URL())
		run(t, f.newRelay(t, conn, nil).Run)
		run(t, f.newService(t, conn).Run)
	}
	f.requireExactlyOneEmailPerOrder(t, f.conn(t, rabbitmqtest.URL()), orderIDs, 60*time.Second)
	require.Equal(t, 2000, f.count(t, `SELECT count(*) FROM inbox`), "order.created and order.paid of each order, once")
	require.Equal(t, 1000, f.count(t, `SELECT count(*) FROM inbox_sequences WHERE applied_seq = 2`), "every order's events applied in sequence")
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM outbox WHERE attempts > 0`), "no publish failed")
}

func TestBrokerConnectionsCutUnderLoadLoseNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	proxy := rabbitmqtest.NewProxy(t, brokerHostPort(t))
	proxied := proxiedURL(t, proxy)
	for range 2 {
		conn := f.conn(t, proxied)
		run(t, f.newRelay(t, conn, nil).Run)
		run(t, f.newService(t, conn).Run)
	}

	var orderIDs []string
	for round := range 5 {
		orderIDs = append(orderIDs, f.paidOrders(t, 100)...)
		// Cut while this round is being relayed and consumed.
		waitFor(t, 10*time.Second, func() bool {
			return f.count(t, `SELECT count(*) FROM notifications`) >= round*100+10
		}, "round %d under way", round)
		require.Positive(t, proxy.CutAll(), "connections cut in round %d", round)
	}
	f.requireExactlyOneEmailPerOrder(t, f.conn(t, rabbitmqtest.URL()), orderIDs, 60*time.Second)
	require.Equal(t, 500, f.count(t, `SELECT count(*) FROM inbox WHERE message_id IN (SELECT id FROM outbox WHERE type = 'order.paid')`))
}

// ready is how many messages wait in queue, unacked ones excluded.
func (f *fixture) ready(t *testing.T, conn *rabbitmq.Conn, queue string) int {
	t.Helper()
	ch, err := conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

func brokerHostPort(t *testing.T) string {
	u, err := url.Parse(rabbitmqtest.URL())
	require.NoError(t, err)
	return u.Host
}

func proxiedURL(t *testing.T, p *rabbitmqtest.Proxy) string {
	u, err := url.Parse(rabbitmqtest.URL())
	require.NoError(t, err)
	u.Host = p.Addr()
	return u.String()
}

// TestRelayWithBatchesInFlightPublishesEachRowOnceInOrder: Run keeps several
// batches waiting for their confirms while it claims the next; still every
// row is published once, in seq order, and marked.
func TestRelayWithBatchesInFlightPublishesEachRowOnceInOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	conn := f.conn(t, rabbitmqtest.URL())
	f.paidOrders(t, 150)
	var want []string
	// The notify queue is bound to order.* (every event of an order, for
	// the consumer's per-order sequence): order.created and order.paid.
	require.NoError(t, f.db.Raw(`SELECT id FROM outbox WHERE type LIKE 'order.%' ORDER BY seq`).Scan(&want).Error)

	var mu sync.Mutex
	var got []string
	c := rabbitmq.NewConsumer(conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyQueue, Concurrency: 1}, func(_ context.Context, d amqp.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, d.MessageId)
		return nil
	})
	run(t, c.Run)
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange, ConfirmTimeout: 5 * time.Second})
	t.Cleanup(func() { pub.Close() })
	relay, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{PollInterval: 50 * time.Millisecond, BatchSize: 7, InFlight: 4})
	require.NoError(t, err)
	stop := run(t, relay.Run)
	waitFor(t, 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= len(want)
	}, "every order event delivered")
	waitFor(t, 10*time.Second, func() bool {
		return f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	}, "every row marked")
	stop()
	time.Sleep(100 * time.Millisecond) // a duplicate would arrive by now
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, want, got, "each order event once, in seq order")
}

// recordingPublisher confirms every message after release is closed (nil:
// at once) and records the order of the message ids it was given.
type recordingPublisher struct {
	release chan struct{}
	called  chan struct{}
	mu      sync.Mutex
	ids     []string
}

func (p *recordingPublisher) Publish(_ context.Context, msgs []rabbitmq.Message) []error {
	p.mu.Lock()
	for _, m := range msgs {
		p.ids = append(p.ids, m.MessageID)
	}
	p.mu.Unlock()
	if p.called != nil {
		close(p.called)
	}
	if p.release != nil {
		<-p.release
	}
	return make([]error, len(msgs))
}

// The claim writes the published mark in the batch's transaction, before
// the publish: it must stay invisible until the confirms are in, and the
// batch must go out in seq order whatever order the rows come back in.
func TestRowsAreMarkedPublishedOnlyAfterTheirConfirmsAndGoOutInSeqOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// Neither the ids nor the insertion (physical) order follow seq.
	for _, r := range []struct {
		id  string
		seq int
	}{{"evt_a", 3}, {"evt_b", 1}, {"evt_c", 5}, {"evt_d", 2}, {"evt_e", 4}} {
		require.NoError(t, f.db.Exec(`INSERT INTO outbox (id, seq, tenant_id, aggregate_id, type, payload, occurred_at)
			VALUES (?, ?, 'acme', 'ord_x', 'order.created', '{}', now())`, r.id, r.seq).Error)
	}
	want := []string{"evt_b", "evt_d", "evt_a", "evt_e", "evt_c"}
	pub := &recordingPublisher{release: make(chan struct{}), called: make(chan struct{})}
	relay, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{BatchSize: 10})
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := relay.RelayBatch(context.Background())
		done <- err
	}()
	<-pub.called
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`), "marked before the confirms")
	close(pub.release)
	require.NoError(t, <-done)
	require.Equal(t, 5, f.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND last_error IS NULL`))
	require.Equal(t, want, pub.ids, "published in seq order")
}
