package notify_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

// orderEvents inserts a paid order with one succeeded refund and returns
// its three events as the outbox sequences them: order.created (1),
// order.paid (2), order.refunded (3).
func (f *fixture) orderEvents(t *testing.T) (orderID, refundID string, created, paid, refunded rabbitmq.Message) {
	t.Helper()
	orderID, refundID = ids.New("ord"), ids.New("rf")
	email := "buyer+" + orderID + "@example.com"
	now := time.Now().UTC()
	require.NoError(t, f.db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, payment_intent_id, created_at, updated_at, refund_reserved, amount_refunded)
		VALUES (?, 'acme', 'partially_refunded', ?, 'usd', 5000, 'pm_card_visa', 'pi_1', ?, ?, 1500, 1500)`, orderID, email, now, now).Error)
	require.NoError(t, f.db.Exec(`INSERT INTO refunds (id, order_id, tenant_id, amount, currency, status, payment_intent_id, created_at, updated_at)
		VALUES (?, ?, 'acme', 1500, 'usd', 'succeeded', 'pi_1', ?, ?)`, refundID, orderID, now, now).Error)
	order := map[string]any{"id": orderID, "status": "paid", "email": email, "currency": "usd", "amount_total": 5000}
	msg := func(typ string, seq int64, data any) rabbitmq.Message {
		ev := outbox.Event{ID: outbox.NewID(), Type: typ, OccurredAt: now, TenantID: "acme", AggregateID: orderID, Sequence: seq, Data: data}
		body, err := json.Marshal(ev)
		require.NoError(t, err)
		return rabbitmq.Message{MessageID: ev.ID, RoutingKey: typ, Body: body}
	}
	return orderID, refundID,
		msg(outbox.TypeOrderCreated, 1, order),
		msg(outbox.TypeOrderPaid, 2, order),
		msg(outbox.TypeOrderRefunded, 3, map[string]any{"id": refundID, "order_id": orderID, "amount": 1500, "currency": "usd", "status": "succeeded"})
}

// kinds returns the kinds of the emails the sink received for orderID's
// notifications, in the order the sink received them.
func (f *fixture) kinds(t *testing.T, orderID string) []string {
	t.Helper()
	var rows []struct{ ID, Kind string }
	require.NoError(t, f.db.Raw(`SELECT id, kind FROM notifications WHERE order_id = ?`, orderID).Scan(&rows).Error)
	kindOf := map[string]string{}
	for _, r := range rows {
		kindOf[notify.MessageID(r.ID)] = r.Kind
	}
	var got []string
	for _, m := range f.sink.Messages() {
		if k, ok := kindOf[m.MessageID]; ok {
			got = append(got, k)
		}
	}
	return got
}

func (f *fixture) startServiceWith(t *testing.T, reg prometheus.Registerer, wait time.Duration) {
	t.Helper()
	svc, err := notify.NewService(f.db, f.conn, &notify.SMTPMailer{Addr: f.sink.Addr()}, notify.Config{
		Queue: f.names.NotifyQueue, Sender: f.senderConfig(), Registerer: reg, SequenceWait: wait,
	})
	require.NoError(t, err)
	run(t, svc.Run)
}

// TestRefundEventBeforePaidEventStillEmailsPaidFirst: the broker delivers
// an order's refund event before its paid event (several dispatchers, a
// retried publish). The refund event is parked until the paid one is
// applied, and the sender sends the paid email first: one of each.
func TestRefundEventBeforePaidEventStillEmailsPaidFirst(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, refundID, created, paid, refunded := f.orderEvents(t)
	reg := prometheus.NewRegistry()
	f.startServiceWith(t, reg, time.Hour) // only the predecessor can unpark it

	f.publish(t, refunded, created)
	// Batches are handled concurrently, so order.created may still be on its
	// way when the refund is parked: order.paid coming before it would be
	// parked too, rightly, and this test is about the refund alone.
	waitFor(t, func() bool {
		return f.count(t, `SELECT count(*) FROM inbox_parked WHERE message_id = ?`, refunded.MessageID) == 1 &&
			f.count(t, `SELECT count(*) FROM inbox_sequences WHERE aggregate_id = ? AND applied_seq = 1`, orderID) == 1
	}, "refund event parked, order.created applied")
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM notifications WHERE order_id = ?`, orderID), "nothing applied past the gap")

	f.publish(t, paid)
	waitFor(t, func() bool { return len(f.kinds(t, orderID)) == 2 }, "both emails sent")
	require.Equal(t, []string{notify.KindOrderPaid, notify.KindOrderRefunded}, f.kinds(t, orderID))
	require.Equal(t, 2, f.sink.Len())
	require.Contains(t, f.sink.Messages()[0].Body, "Amount paid: 50.00 USD", "the order's total, from its event")
	require.Contains(t, f.sink.Messages()[1].Body, "Amount refunded: 15.00 USD", "the refund's amount, from its event")
	// Both read the order's total and currency from their own row: the
	// sender names no other package's table.
	require.Equal(t, 2, f.count(t, `SELECT count(*) FROM notifications WHERE order_id = ? AND order_amount = 5000 AND currency = 'usd'`, orderID))
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM notifications WHERE order_id = ? AND kind = 'order_refunded' AND refund_id = ?`, orderID, refundID))
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM inbox_parked`))
	require.Equal(t, 3, f.count(t, `SELECT applied_seq FROM inbox_sequences WHERE aggregate_id = ?`, orderID))

	seq := func(result string) float64 {
		return testutil.ToFloat64(counterOf(t, reg, "checkout_notify_sequence_events_total", result))
	}
	require.Equal(t, 1.0, seq(notify.SequenceParked))
	require.Equal(t, 1.0, seq(notify.SequenceUnparked))
	require.Equal(t, 0.0, seq(notify.SequenceReleased))

	for _, m := range f.sink.Messages() {
		if m.Subject == "Your refund for order "+orderID {
			require.Contains(t, m.Body, "15.00 USD")
			require.Contains(t, m.Body, refundID)
		}
	}
}

// TestEarlyEventIsReleasedAfterTheWait: a predecessor that never comes
// holds its successor for SequenceWait only; the event is then applied and
// counted, and the predecessor arriving late is applied too.
func TestEarlyEventIsReleasedAfterTheWait(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, _, created, paid, refunded := f.orderEvents(t)
	reg := prometheus.NewRegistry()
	f.startServiceWith(t, reg, 300*time.Millisecond)

	// order.created first, applied before the refund is parked: batches run
	// concurrently, and one that held it past the wait would have it given
	// up on too.
	f.publish(t, created)
	waitFor(t, func() bool {
		return f.count(t, `SELECT count(*) FROM inbox_sequences WHERE aggregate_id = ? AND applied_seq = 1`, orderID) == 1
	}, "order.created applied")
	f.publish(t, refunded) // order.paid (2) is lost for now
	waitFor(t, func() bool { return len(f.kinds(t, orderID)) == 1 }, "refund email sent after the wait")
	require.Equal(t, []string{notify.KindOrderRefunded}, f.kinds(t, orderID))
	require.Equal(t, 1.0, testutil.ToFloat64(counterOf(t, reg, "checkout_notify_sequence_events_total", notify.SequenceReleased)))
	require.Equal(t, 1.0, testutil.ToFloat64(counterOf(t, reg, "checkout_notify_sequence_skipped_total", "")))

	f.publish(t, paid) // late: applied anyway, once
	waitFor(t, func() bool { return len(f.kinds(t, orderID)) == 2 }, "late paid email sent")
	require.Equal(t, 1.0, testutil.ToFloat64(counterOf(t, reg, "checkout_notify_sequence_events_total", notify.SequenceLate)))
	require.Equal(t, 2, f.sink.Len())
}

// TestOverdueEventOfAGoneOrderIsDropped: a parked refund event whose order
// was deleted meanwhile cannot be applied once its wait is over. It is
// dropped, and the other overdue events released with it are applied: one
// refund email for the order that exists, none for the one that is gone,
// nothing left parked.
func TestOverdueEventOfAGoneOrderIsDropped(t *testing.T) {
	t.Parallel()
	f := setup(t)
	gone, _, _, _, goneRefunded := f.orderEvents(t)
	kept, _, _, _, keptRefunded := f.orderEvents(t)
	require.NoError(t, f.db.Exec(`DELETE FROM orders WHERE id = ?`, gone).Error)
	reg := prometheus.NewRegistry()
	f.startServiceWith(t, reg, 300*time.Millisecond)

	f.publish(t, goneRefunded, keptRefunded) // both wait for order.paid (2), which never comes
	waitFor(t, func() bool { return len(f.kinds(t, kept)) == 1 }, "the refund email of the order that exists")
	// The two may be released by different sweeps: their parked_at differ.
	waitFor(t, func() bool { return f.count(t, `SELECT count(*) FROM inbox_parked`) == 0 }, "nothing left parked")
	require.Equal(t, []string{notify.KindOrderRefunded}, f.kinds(t, kept))
	require.Equal(t, 1, f.sink.Len())
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM notifications WHERE order_id = ?`, gone))
	require.Equal(t, 2.0, testutil.ToFloat64(counterOf(t, reg, "checkout_notify_sequence_events_total", notify.SequenceReleased)))
}

// TestSenderKeepsAnOrdersEmailsInSequence: with both notifications pending
// and the paid one refused by the SMTP server at first, the refund email
// waits for the paid one instead of overtaking it.
func TestSenderKeepsAnOrdersEmailsInSequence(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, refundID, _, _, _ := f.orderEvents(t)
	require.NoError(t, f.db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, event_seq)
		VALUES (?, ?, 'acme', 'email', 'a@example.com', 'pending', 'order_paid', 2)`, ids.New("ntf"), orderID).Error)
	require.NoError(t, f.db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind, refund_id, event_seq)
		VALUES (?, ?, 'acme', 'email', 'a@example.com', 'pending', 'order_refunded', ?, 3)`, ids.New("ntf"), orderID, refundID).Error)
	f.sink.Reject(2)
	run(t, f.newSender(t, f.senderConfig()).Run)
	waitFor(t, func() bool { return len(f.kinds(t, orderID)) == 2 }, "both emails sent")
	require.Equal(t, []string{notify.KindOrderPaid, notify.KindOrderRefunded}, f.kinds(t, orderID))
}

// counterOf returns the series of name with label result (any label when
// result is empty) from reg.
func counterOf(t *testing.T, reg *prometheus.Registry, name, result string) prometheus.Collector {
	t.Helper()
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				match := result == ""
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "result" && lp.GetValue() == result {
						match = true
					}
				}
				if match {
					ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "", nil, nil), prometheus.CounterValue, m.GetCounter().GetValue())
					return
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "", nil, nil), prometheus.CounterValue, 0)
	})
}

type collectorFunc func(ch chan<- prometheus.Metric)

func (f collectorFunc) Describe(chan<- *prometheus.Desc)    {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

// TestParkedEventKeepsItsTrace: an event that overtook its predecessor is
// applied later, by the predecessor's delivery or by the release after the
// wait, and its email still joins the event's own trace (the traceparent
// in its AMQP headers), not the trace of whatever applied it (issue 38:
// an order.paid that overtook its order.created sent its email outside the
// checkout's trace). With tracing off, the consume span is the header's
// span context itself, so the notification keeps the header's traceparent.
func TestParkedEventKeepsItsTrace(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, _, created, paid, refunded := f.orderEvents(t)
	f.startServiceWith(t, prometheus.NewRegistry(), time.Hour) // only the predecessor can unpark them
	traced := func(m rabbitmq.Message, traceID string) rabbitmq.Message {
		m.Headers = amqp.Table{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}
		return m
	}
	const createdTrace, paidTrace, refundTrace = "11111111111111111111111111111111", "22222222222222222222222222222222", "33333333333333333333333333333333"

	// order.paid and order.refunded park behind order.created, whose
	// delivery unparks and applies both.
	f.publish(t, traced(paid, paidTrace), traced(refunded, refundTrace))
	waitFor(t, func() bool {
		return f.count(t, `SELECT count(*) FROM inbox_parked WHERE aggregate_id = ?`, orderID) == 2
	}, "both events parked")
	f.publish(t, traced(created, createdTrace))
	waitFor(t, func() bool { return len(f.kinds(t, orderID)) == 2 }, "both emails sent")

	traceOf := func(kind string) string {
		var tp []string
		require.NoError(t, f.db.Raw(`SELECT coalesce(traceparent, '') FROM notifications WHERE order_id = ? AND kind = ?`, orderID, kind).Scan(&tp).Error)
		require.Len(t, tp, 1)
		return tp[0]
	}
	require.Contains(t, traceOf(notify.KindOrderPaid), paidTrace, "the paid email joins order.paid's trace")
	require.Contains(t, traceOf(notify.KindOrderRefunded), refundTrace, "the refund email joins order.refunded's trace")
}

// TestReleasedEventKeepsItsTrace: an event released after the wait, its
// predecessor lost, keeps its own trace too.
func TestReleasedEventKeepsItsTrace(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID, _, created, _, refunded := f.orderEvents(t)
	f.startServiceWith(t, prometheus.NewRegistry(), 300*time.Millisecond)
	f.publish(t, created)
	waitFor(t, func() bool {
		return f.count(t, `SELECT count(*) FROM inbox_sequences WHERE aggregate_id = ? AND applied_seq = 1`, orderID) == 1
	}, "order.created applied")
	const refundTrace = "44444444444444444444444444444444"
	refunded.Headers = amqp.Table{"traceparent": "00-" + refundTrace + "-00f067aa0ba902b7-01"}
	f.publish(t, refunded) // order.paid (2) is lost for now
	waitFor(t, func() bool { return len(f.kinds(t, orderID)) == 1 }, "refund email sent after the wait")
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM notifications WHERE order_id = ? AND kind = 'order_refunded' AND traceparent LIKE ?`,
		orderID, "00-"+refundTrace+"-%"), "the released refund's email joins its own trace")
}
