package notify_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/deadletter"
	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

// metric is the value of the series name{labels} in reg (0 if absent).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	return 0
}

// TestFailingHandlerIsDeadLetteredRecordedAndRedrivenOnce: an event the
// handler fails five times (a bug of the worker, say) leaves the queue for
// the dead-letter queue, whose recorder writes it to dead_letters with why,
// counts it in /metrics and acknowledges it; once the bug is fixed,
// deadletter.Redrive (`worker redrive-dead-letters`) sends it through again
// and the order gets its one email. A second redrive of the same event
// sends nothing more: the inbox drops it.
func TestFailingHandlerIsDeadLetteredRecordedAndRedrivenOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, msg := f.paidOrder(t)
	reg := prometheus.NewRegistry()
	svc, err := notify.NewService(f.db, f.conn, &notify.SMTPMailer{Addr: f.sink.Addr()}, notify.Config{
		Queue: f.names.NotifyQueue, DeadLetterQueue: f.names.NotifyDLQ, FailureLimit: f.names.DeliveryLimit,
		Sender: f.senderConfig(), Registerer: reg,
	})
	require.NoError(t, err)
	var broken atomic.Bool
	var failures atomic.Int32
	broken.Store(true)
	notify.SetServiceAfterInbox(svc, func() error {
		if broken.Load() {
			failures.Add(1)
			// A refusal of the database, which no retry in place fixes.
			return &pgconn.PgError{Code: "23514", Message: "bug in the worker"}
		}
		return nil
	})
	run(t, svc.Run)
	rec, err := deadletter.NewRecorder(f.db, f.conn, deadletter.RecorderConfig{Queue: f.names.NotifyDLQ,
		GaugeInterval: 20 * time.Millisecond, Registerer: reg})
	require.NoError(t, err)
	run(t, rec.Run)
	f.publish(t, msg)

	waitFor(t, func() bool { return f.count(t, `SELECT count(*) FROM dead_letters`) == 1 }, "dead letter recorded")
	require.Equal(t, int32(5), failures.Load(), "dead-lettered after five handler failures")
	letters, err := deadletter.Unresolved(context.Background(), f.db, deadletter.Filter{})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	l := letters[0]
	require.Equal(t, f.names.NotifyQueue, l.Queue)
	require.Equal(t, msg.MessageID, l.MessageID)
	require.Equal(t, "order.paid", l.RoutingKey)
	require.Equal(t, deadletter.ReasonHandlerFailed, l.Reason)
	require.Equal(t, 5, l.Failures)
	require.Contains(t, l.LastError, "bug in the worker")
	require.Equal(t, msg.Body, l.Body)
	// Counted just after the row's commit, which the wait above saw.
	waitFor(t, func() bool {
		return metric(t, reg, "checkout_dead_letters_total", map[string]string{"reason": "handler_failed"}) == 1
	}, "dead letter counted")
	waitFor(t, func() bool { return metric(t, reg, "checkout_dead_letters_unresolved", nil) == 1 }, "unresolved gauge at 1")
	waitFor(t, func() bool { return f.ready(t, f.names.NotifyDLQ) == 0 && f.ready(t, f.names.NotifyQueue) == 0 },
		"the dead letter acknowledged once recorded")
	require.Empty(t, f.notifications(t, orderID))

	broken.Store(false) // the fix is deployed
	pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: ""})
	t.Cleanup(func() { pub.Close() })
	n, err := deadletter.Redrive(context.Background(), f.db, pub, deadletter.Filter{}, time.Now)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	f.requireOneEmailSent(t, orderID)
	waitFor(t, func() bool { return metric(t, reg, "checkout_dead_letters_unresolved", nil) == 0 }, "unresolved gauge at 0")

	n, err = deadletter.Redrive(context.Background(), f.db, pub, deadletter.Filter{}, time.Now)
	require.NoError(t, err)
	require.Equal(t, 0, n, "nothing left unresolved")

	// A redrive whose mark was lost sends the event again: a duplicate.
	require.NoError(t, f.db.Exec(`UPDATE dead_letters SET redriven_at = NULL`).Error)
	n, err = deadletter.Redrive(context.Background(), f.db, pub, deadletter.Filter{MessageID: msg.MessageID}, time.Now)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitFor(t, func() bool { return f.ready(t, f.names.NotifyQueue) == 0 }, "the copy consumed")
	waitFor(t, func() bool {
		return metric(t, reg, "checkout_inbox_duplicates_total", map[string]string{"consumer": notify.ConsumerName}) == 1
	}, "the copy dropped as a duplicate")
	require.Equal(t, 1, f.sink.Len(), "one email")
	require.Len(t, f.notifications(t, orderID), 1)
}

// TestRefundWaitsForItsDeadLetteredPaidEvent (CONTRACT.md v2: a refund
// email never precedes that order's paid email): the order's paid event
// fails its handler five times and is dead-lettered; its refund event
// comes next and is parked. However overdue it is, it stays parked while
// the paid event is an unresolved dead letter: no refund email. Once the
// paid event is redriven and handled, both go, the paid email first, one
// of each. Before, the refund was released after NOTIFY_SEQUENCE_WAIT and
// its email went out first.
func TestRefundWaitsForItsDeadLetteredPaidEvent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, _, created, paid, refunded := f.orderEvents(t)
	svc, err := notify.NewService(f.db, f.conn, &notify.SMTPMailer{Addr: f.sink.Addr()}, notify.Config{
		Queue: f.names.NotifyQueue, DeadLetterQueue: f.names.NotifyDLQ, FailureLimit: f.names.DeliveryLimit,
		Sender: f.senderConfig(), Registerer: prometheus.NewRegistry(),
		SequenceWait: time.Hour, // releases are this test's own calls below
	})
	require.NoError(t, err)
	var broken atomic.Bool
	notify.SetServiceAfterInbox(svc, func() error {
		if broken.Load() {
			return &pgconn.PgError{Code: "23514", Message: "bug in the worker"}
		}
		return nil
	})
	run(t, svc.Run)
	rec, err := deadletter.NewRecorder(f.db, f.conn, deadletter.RecorderConfig{Queue: f.names.NotifyDLQ})
	require.NoError(t, err)
	run(t, rec.Run)

	f.publish(t, created)
	waitFor(t, func() bool {
		return f.count(t, `SELECT count(*) FROM inbox_sequences WHERE aggregate_id = ? AND applied_seq = 1`, orderID) == 1
	}, "order.created applied")
	broken.Store(true)
	f.publish(t, paid)
	waitFor(t, func() bool { return f.count(t, `SELECT count(*) FROM dead_letters`) == 1 }, "order.paid dead-lettered")
	broken.Store(false)
	f.publish(t, refunded)
	waitFor(t, func() bool {
		return f.count(t, `SELECT count(*) FROM inbox_parked WHERE message_id = ?`, refunded.MessageID) == 1
	}, "order.refunded parked behind order.paid")

	// Every parked event is overdue for a wait of 0: the refund stays.
	released, err := f.newConsumer(t).ReleaseOverdue(context.Background(), 0)
	require.NoError(t, err)
	require.Zero(t, released, "held behind the dead-lettered paid event")
	require.Empty(t, f.notifications(t, orderID), "no refund email before the paid one")

	pub := rabbitmq.NewPublisher(f.conn, rabbitmq.PublisherConfig{Exchange: ""})
	t.Cleanup(func() { pub.Close() })
	n, err := deadletter.Redrive(context.Background(), f.db, pub, deadletter.Filter{}, time.Now)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	waitFor(t, func() bool { return len(f.kinds(t, orderID)) == 2 }, "both emails sent")
	require.Equal(t, []string{notify.KindOrderPaid, notify.KindOrderRefunded}, f.kinds(t, orderID))
	require.Len(t, f.notifications(t, orderID), 2, "one of each")
	require.Equal(t, 2, f.sink.Len())
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM inbox_parked`))
}
