package notify_test

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fixture bundles one test's database, topology, broker connection,
// publisher and SMTP sink.
type fixture struct {
	db    *gorm.DB
	names rabbitmq.Names
	conn  *rabbitmq.Conn
	pub   *rabbitmq.Publisher
	sink  *smtpsink.Sink
}

func setup(t *testing.T) *fixture {
	t.Helper()
	db, _ := pgtest.NewDB(t)
	names := rabbitmqtest.NewNames(t)
	conn := rabbitmqtest.Dial(t, rabbitmqtest.URL())
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: names.Exchange})
	t.Cleanup(func() { pub.Close() })
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	return &fixture{db: db, names: names, conn: conn, pub: pub, sink: sink}
}

// senderConfig is fast enough for tests.
func (f *fixture) senderConfig() notify.SenderConfig {
	return notify.SenderConfig{SweepInterval: 50 * time.Millisecond, MinRetry: 10 * time.Millisecond, MaxRetry: 50 * time.Millisecond}
}

// paidOrder inserts a paid order and returns its order.paid event body, as
// the checkout writes it to the outbox.
func (f *fixture) paidOrder(t *testing.T) (orderID string, msg rabbitmq.Message) {
	t.Helper()
	orderID = ids.New("ord")
	now := time.Now().UTC()
	require.NoError(t, f.db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES (?, 'acme', 'paid', ?, 'usd', 5000, 'pm_card_visa', ?, ?)`, orderID, "buyer+"+orderID+"@example.com", now, now).Error)
	ev := outbox.Event{ID: outbox.NewID(), Type: outbox.TypeOrderPaid, OccurredAt: now, TenantID: "acme", Data: map[string]any{
		"id": orderID, "status": "paid", "email": "buyer+" + orderID + "@example.com", "currency": "usd", "amount_total": 5000,
	}}
	body, err := json.Marshal(ev)
	require.NoError(t, err)
	return orderID, rabbitmq.Message{MessageID: ev.ID, RoutingKey: outbox.TypeOrderPaid, Body: body}
}

func (f *fixture) publish(t *testing.T, msgs ...rabbitmq.Message) {
	t.Helper()
	for _, err := range f.pub.Publish(context.Background(), msgs) {
		require.NoError(t, err)
	}
}

// run runs loop until the test ends, then checks that it returned nil.
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

// consume runs a rabbitmq consumer of the notify queue with handler h.
func (f *fixture) consume(t *testing.T, h rabbitmq.Handler) (stop func()) {
	c := rabbitmq.NewConsumer(f.conn, rabbitmq.ConsumerConfig{Queue: f.names.NotifyQueue, MinBackoff: 10 * time.Millisecond,
		FailureLimit: f.names.DeliveryLimit, DeadLetterQueue: f.names.NotifyDLQ}, h)
	return run(t, c.Run)
}

func (f *fixture) newConsumer(t *testing.T) *notify.Consumer {
	t.Helper()
	c, err := notify.NewConsumer(f.db, notify.ConsumerConfig{})
	require.NoError(t, err)
	return c
}

func (f *fixture) newSender(t *testing.T, cfg notify.SenderConfig) *notify.Sender {
	t.Helper()
	s, err := notify.NewSender(f.db, &notify.SMTPMailer{Addr: f.sink.Addr()}, cfg)
	require.NoError(t, err)
	return s
}

func (f *fixture) startService(t *testing.T) (stop func()) {
	t.Helper()
	svc, err := notify.NewService(f.db, f.conn, &notify.SMTPMailer{Addr: f.sink.Addr()}, notify.Config{
		Queue: f.names.NotifyQueue, Sender: f.senderConfig(), Registerer: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	return run(t, svc.Run)
}

func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 10*time.Millisecond, fmt.Sprintf(format, args...))
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.Raw(query, args...).Scan(&n).Error)
	return n
}

// notification is a notification row as the tests check it.
type notification struct {
	ID, Status string
	Attempts   int
	SentAt     *time.Time
	LastError  *string
}

func (f *fixture) notifications(t *testing.T, orderID string) []notification {
	t.Helper()
	var rows []notification
	require.NoError(t, f.db.Raw(`SELECT id, status, attempts, sent_at, last_error FROM notifications WHERE order_id = ?`, orderID).Scan(&rows).Error)
	return rows
}

// ready is how many messages wait in queue, unacked ones excluded.
func (f *fixture) ready(t *testing.T, queue string) int {
	t.Helper()
	ch, err := f.conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// requireOneEmailSent checks the end state of a notified order: one row,
// sent, and exactly one email with its Message-ID.
func (f *fixture) requireOneEmailSent(t *testing.T, orderID string) notification {
	t.Helper()
	var rows []notification
	waitFor(t, func() bool {
		rows = f.notifications(t, orderID)
		return len(rows) == 1 && rows[0].Status == "sent"
	}, "notification of %s sent", orderID)
	require.NotNil(t, rows[0].SentAt)
	require.Equal(t, 1, f.sink.Count(notify.MessageID(rows[0].ID)), "emails for %s", orderID)
	return rows[0]
}

func TestSameMessageTwiceGivesOneNotificationAndOneEmail(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, msg := f.paidOrder(t)
	f.publish(t, msg, msg)
	f.startService(t)

	n := f.requireOneEmailSent(t, orderID)
	waitFor(t, func() bool { return f.ready(t, f.names.NotifyQueue) == 0 }, "queue drained")
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM inbox WHERE consumer = ? AND message_id = ?`, notify.ConsumerName, msg.MessageID))
	require.Equal(t, 1, f.sink.Len())

	m := f.sink.Messages()[0]
	require.Equal(t, "<notification-"+n.ID+"@checkout.local>", m.MessageID)
	require.Equal(t, "orders@checkout.local", m.From)
	require.Equal(t, []string{"buyer+" + orderID + "@example.com"}, m.To)
	require.Contains(t, m.Body, orderID)
	require.Contains(t, m.Body, "50.00 USD")
}

func TestConsumerFailingAfterCommitBeforeAckIsRedeliveredAndDeduplicated(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, msg := f.paidOrder(t)
	c := f.newConsumer(t)
	var calls atomic.Int32
	f.consume(t, func(ctx context.Context, d amqp.Delivery) error {
		err := c.Handle(ctx, d) // commits
		if calls.Add(1) == 1 {
			return errors.New("crash between commit and ack") // nack: redelivered
		}
		return err
	})
	f.publish(t, msg)

	waitFor(t, func() bool { return calls.Load() == 2 }, "redelivered once")
	waitFor(t, func() bool { return f.ready(t, f.names.NotifyQueue) == 0 }, "acked")
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM inbox`))
	rows := f.notifications(t, orderID)
	require.Len(t, rows, 1)
	require.Equal(t, "pending", rows[0].Status)

	run(t, f.newSender(t, f.senderConfig()).Run)
	f.requireOneEmailSent(t, orderID)
	require.Equal(t, int32(2), calls.Load())
}

func TestCrashAfterAckBeforeSendIsSentByTheSweeper(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, msg := f.paidOrder(t)
	stopConsumer := f.consume(t, f.newConsumer(t).Handle)
	f.publish(t, msg)
	waitFor(t, func() bool { return len(f.notifications(t, orderID)) == 1 }, "notification recorded")
	// The worker dies here: the message is acked, no email has left.
	stopConsumer()
	require.Equal(t, 0, f.ready(t, f.names.NotifyQueue))
	require.Equal(t, 0, f.sink.Len())

	// A new worker's sweeper finds the pending row without any message.
	run(t, f.newSender(t, f.senderConfig()).Run)
	n := f.requireOneEmailSent(t, orderID)
	require.Equal(t, 1, n.Attempts)
}

func TestRolledBackInboxRecordIsProcessedOnRedelivery(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, msg := f.paidOrder(t)
	c := f.newConsumer(t)
	var fails atomic.Int32
	notify.SetAfterInbox(c, func() error {
		if fails.Add(1) == 1 {
			return errors.New("database failed after the inbox insert")
		}
		return nil
	})
	f.consume(t, c.Handle)
	run(t, f.newSender(t, f.senderConfig()).Run)
	f.publish(t, msg)

	f.requireOneEmailSent(t, orderID)
	require.Equal(t, int32(2), fails.Load(), "the redelivery ran the transaction again")
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM inbox`))
	require.Equal(t, 1, f.sink.Len())
}

func TestPoisonMessageReachesTheDeadLetterQueueAfterFiveDeliveries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, good := f.paidOrder(t)
	c := f.newConsumer(t)
	var mu sync.Mutex
	deliveries := map[string]int{}
	f.consume(t, func(ctx context.Context, d amqp.Delivery) error {
		mu.Lock()
		deliveries[d.MessageId]++
		mu.Unlock()
		return c.Handle(ctx, d)
	})
	run(t, f.newSender(t, f.senderConfig()).Run)
	f.publish(t,
		rabbitmq.Message{MessageID: "evt_not_json", RoutingKey: outbox.TypeOrderPaid, Body: []byte("{not json")},
		rabbitmq.Message{MessageID: "evt_unknown_order", RoutingKey: outbox.TypeOrderPaid,
			Body: []byte(`{"id":"evt_unknown_order","type":"order.paid","tenant_id":"acme","data":{"id":"ord_missing","email":"a@example.com"}}`)},
		good)

	waitFor(t, func() bool { return f.ready(t, f.names.NotifyDLQ) == 2 }, "both poison messages dead-lettered")
	f.requireOneEmailSent(t, orderID)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"evt_not_json": 5, "evt_unknown_order": 5, good.MessageID: 1}, deliveries)
	require.Equal(t, 0, f.ready(t, f.names.NotifyQueue))
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM notifications`))
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM inbox`), "failed messages leave no inbox record")
}

func TestRefusedSendIsRetriedWithBackoffThenSent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, msg := f.paidOrder(t)
	f.sink.Reject(2)
	f.startService(t)
	f.publish(t, msg)

	n := f.requireOneEmailSent(t, orderID)
	require.Equal(t, 3, n.Attempts)
	require.Nil(t, n.LastError)
	require.Equal(t, 1, f.sink.Len())
}

func TestExpiredSendingClaimIsTakenOver(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, _ := f.paidOrder(t)
	id := ids.New("ntf")
	// A sender claimed it and died: status sending, claim expired.
	require.NoError(t, f.db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, attempts, claimed_until, next_attempt_at)
		VALUES (?, ?, 'acme', 'email', 'a@example.com', 'sending', 1, now() - interval '1 second', now() - interval '1 second')`, id, orderID).Error)
	live := ids.New("ntf")
	otherOrder, _ := f.paidOrder(t)
	// Another sender holds a live claim: not touched.
	require.NoError(t, f.db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, attempts, claimed_until, next_attempt_at)
		VALUES (?, ?, 'acme', 'email', 'b@example.com', 'sending', 1, now() + interval '1 hour', now() + interval '1 hour')`, live, otherOrder).Error)

	s := f.newSender(t, f.senderConfig())
	claimed, err := s.SendDue(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, claimed)
	n := f.requireOneEmailSent(t, orderID)
	require.Equal(t, 2, n.Attempts)
	require.Equal(t, "sending", f.notifications(t, otherOrder)[0].Status)
	require.Equal(t, 0, f.sink.Count(notify.MessageID(live)))
}

func TestFormatHasDeterministicMessageIDAndNoHeaderInjection(t *testing.T) {
	t.Parallel()
	raw := string(notify.Format(notify.Email{
		MessageID: notify.MessageID("ntf_1"), From: "orders@checkout.local", To: "a@example.com",
		Subject: "paid\r\nBcc: evil@example.com", Body: "line 1\nline 2\n",
	}, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	require.Contains(t, raw, "Message-ID: <notification-ntf_1@checkout.local>\r\n")
	require.Contains(t, raw, "Subject: paid Bcc: evil@example.com\r\n")
	require.NotContains(t, raw, "\r\nBcc:")
	require.True(t, strings.HasSuffix(raw, "\r\n\r\nline 1\r\nline 2\r\n"))
}

// consumerOfAGoneDatabase returns a consumer on a handle to a database that
// is gone: a closed pool fails like a refused connection, not an answer
// from the server.
func consumerOfAGoneDatabase(t *testing.T) *notify.Consumer {
	t.Helper()
	down, _ := pgtest.NewDB(t)
	sqlDB, err := down.DB()
	require.NoError(t, err)
	require.NoError(t, sqlDB.Close())
	c, err := notify.NewConsumer(down, notify.ConsumerConfig{})
	require.NoError(t, err)
	return c
}

// TestDatabaseOutageDoesNotDeadLetter: while the consumer's database is
// unreachable its errors are transient, so the delivery is held and retried
// instead of being spent toward the dead-letter queue; an unknown order is
// not transient and goes the poison way.
func TestDatabaseOutageDoesNotDeadLetter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, msg := f.paidOrder(t)

	c := consumerOfAGoneDatabase(t)
	err := c.Handle(context.Background(), amqp.Delivery{MessageId: msg.MessageID, Body: msg.Body})
	require.Error(t, err)
	require.True(t, rabbitmq.IsTransient(err), "a database outage is transient: %v", err)

	unknown := msg
	unknown.Body = []byte(strings.Replace(string(msg.Body), `"id":"ord_`, `"id":"ord_unknown`, 1))
	err = f.newConsumer(t).Handle(context.Background(), amqp.Delivery{MessageId: "evt_unknown", Body: unknown.Body})
	require.Error(t, err)
	require.False(t, rabbitmq.IsTransient(err), "an unknown order is the message's fault: %v", err)
}

// TestMarkSentSurvivesADatabaseBlip: the email has left when the database
// briefly fails the "sent" update; the update is retried, so the claim does
// not expire into a second email.
func TestMarkSentSurvivesADatabaseBlip(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, msg := f.paidOrder(t)
	var failures atomic.Int32
	require.NoError(t, f.db.Callback().Raw().Before("gorm:raw").Register("test:blip", func(tx *gorm.DB) {
		if strings.Contains(tx.Statement.SQL.String(), "SET status = 'sent'") && failures.Add(1) <= 3 {
			tx.AddError(driver.ErrBadConn)
		}
	}))
	stop := f.consume(t, f.newConsumer(t).Handle)
	f.publish(t, msg)
	waitFor(t, func() bool { return len(f.notifications(t, orderID)) == 1 }, "notification recorded")
	stop()

	cfg := f.senderConfig()
	cfg.ClaimTTL, cfg.SendTimeout = 2*time.Second, time.Second // without the retry, the claim expires and the email goes again
	run(t, f.newSender(t, cfg).Run)
	f.requireOneEmailSent(t, orderID)
	time.Sleep(cfg.ClaimTTL + 500*time.Millisecond) // a whole claim: no second send may follow
	require.Equal(t, 1, f.sink.Len(), "one email")
	require.GreaterOrEqual(t, failures.Load(), int32(4), "the update failed three times, then succeeded")
}

// TestInternationalAddress: an RFC 6531 address is delivered: the domain in
// its IDNA ASCII form, the local part over SMTPUTF8.
func TestInternationalAddress(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, to := range []string{"buyer@exämple.com", "josé@exämple.com"} {
		err := (&notify.SMTPMailer{Addr: f.sink.Addr()}).Send(context.Background(), notify.Email{
			MessageID: notify.MessageID(to), From: "orders@checkout.local", To: to, Subject: "s", Body: "b"})
		require.NoError(t, err, to)
	}
	msgs := f.sink.Messages()
	require.Len(t, msgs, 2)
	require.Equal(t, []string{"buyer@xn--exmple-cua.com"}, msgs[0].To)
	require.Equal(t, []string{"josé@xn--exmple-cua.com"}, msgs[1].To)
}

// inFlight is a Mailer that counts the sends in progress and the most seen
// at once.
type inFlight struct {
	notify.Mailer
	now, most atomic.Int32
}

func (m *inFlight) Send(ctx context.Context, e notify.Email) error {
	n := m.now.Add(1)
	defer m.now.Add(-1)
	for most := m.most.Load(); n > most && !m.most.CompareAndSwap(most, n); most = m.most.Load() {
	}
	time.Sleep(20 * time.Millisecond) // long enough for sends to overlap
	return m.Mailer.Send(ctx, e)
}

// TestSenderConcurrencyBelowItsBatchSize: with fewer sends at once
// (SMTP_CONCURRENCY) than a claim's default size, the sender claims no more
// than it may send at once, sends every email once, never more than
// Concurrency at a time, and stops when asked (it used to claim 40 with 3
// slots, and its sends then waited for ever to give back slots never taken).
func TestSenderConcurrencyBelowItsBatchSize(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var orders []string
	for range 12 {
		orderID, _ := f.paidOrder(t)
		require.NoError(t, f.db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status)
			VALUES (?, ?, 'acme', 'email', 'a@example.com', 'pending')`, ids.New("ntf"), orderID).Error)
		orders = append(orders, orderID)
	}
	m := &inFlight{Mailer: &notify.SMTPMailer{Addr: f.sink.Addr()}}
	cfg := f.senderConfig()
	cfg.Concurrency = 3
	s, err := notify.NewSender(f.db, m, cfg)
	require.NoError(t, err)
	stop := run(t, s.Run)
	for _, orderID := range orders {
		f.requireOneEmailSent(t, orderID)
	}
	require.Equal(t, 12, f.sink.Len())
	require.LessOrEqual(t, m.most.Load(), int32(3))
	stop() // returns: every send gave its slot back
}
