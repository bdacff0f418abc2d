package notify_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

func delivery(m rabbitmq.Message) amqp.Delivery {
	return amqp.Delivery{MessageId: m.MessageID, RoutingKey: m.RoutingKey, Body: m.Body}
}

// TestPoisonMessageDoesNotFailTheHealthyMessagesOfItsBatch: a batch holds
// an order.paid event of an unknown order (the database refuses its
// notification, so the batch's one statement fails), a malformed body and
// two good events. Only the two bad deliveries fail, as non-transient
// errors (so they spend their deliveries toward the dead-letter queue); the
// good ones are recorded and notified, and nothing of the bad ones is.
func TestPoisonMessageDoesNotFailTheHealthyMessagesOfItsBatch(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.newConsumer(t)
	order1, good1 := f.paidOrder(t)
	order2, good2 := f.paidOrder(t)
	_, unknown := f.paidOrder(t)
	unknown.MessageID = "evt_unknown_order"
	unknown.Body = []byte(strings.Replace(string(unknown.Body), `"id":"ord_`, `"id":"ord_unknown`, 1))
	notJSON := rabbitmq.Message{MessageID: "evt_not_json", RoutingKey: "order.paid", Body: []byte("{not json")}

	errs := c.HandleBatch(context.Background(), []amqp.Delivery{delivery(good1), delivery(unknown), delivery(notJSON), delivery(good2)})
	require.Len(t, errs, 4)
	require.NoError(t, errs[0])
	require.Error(t, errs[1])
	require.False(t, rabbitmq.IsTransient(errs[1]), "an unknown order is the message's fault: %v", errs[1])
	require.Error(t, errs[2])
	require.False(t, rabbitmq.IsTransient(errs[2]))
	require.NoError(t, errs[3])
	require.Len(t, f.notifications(t, order1), 1)
	require.Len(t, f.notifications(t, order2), 1)
	require.Equal(t, 2, f.count(t, `SELECT count(*) FROM inbox`), "no inbox record of the failed messages")
	require.Equal(t, 2, f.count(t, `SELECT count(*) FROM notifications`))
}

// TestMessageTwiceInABatchIsProcessedOnce: a re-published message can come
// twice in one batch; both deliveries are acked, one inbox record and one
// notification are written, and a later batch with it is a duplicate.
func TestMessageTwiceInABatchIsProcessedOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.newConsumer(t)
	orderID, msg := f.paidOrder(t)
	require.Equal(t, []error{nil, nil}, c.HandleBatch(context.Background(), []amqp.Delivery{delivery(msg), delivery(msg)}))
	require.Equal(t, []error{nil}, c.HandleBatch(context.Background(), []amqp.Delivery{delivery(msg)}))
	require.Len(t, f.notifications(t, orderID), 1)
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM inbox`))
}

// TestAnOrdersEventsInOneBatchAreAppliedInSequence: an order's three events
// come in one batch, in reverse order; they are admitted in sequence in the
// batch's transaction, each in its turn, so none is parked and the paid
// notification comes before the refund's (event_seq 2, then 3).
func TestAnOrdersEventsInOneBatchAreAppliedInSequence(t *testing.T) {
	t.Parallel()
	f := setup(t)
	reg := prometheus.NewRegistry()
	c, err := notify.NewConsumer(f.db, notify.ConsumerConfig{Registerer: reg})
	require.NoError(t, err)
	orderID, _, created, paid, refunded := f.orderEvents(t)
	require.Equal(t, []error{nil, nil, nil},
		c.HandleBatch(context.Background(), []amqp.Delivery{delivery(refunded), delivery(paid), delivery(created)}))
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM inbox_parked`))
	seq := func(result string) float64 {
		return testutil.ToFloat64(counterOf(t, reg, "checkout_notify_sequence_events_total", result))
	}
	require.Equal(t, 3.0, seq(notify.SequenceInOrder), "each admitted as its order's next")
	require.Equal(t, 0.0, seq(notify.SequenceParked), "none came before its predecessor")
	require.Equal(t, 3, f.count(t, `SELECT applied_seq FROM inbox_sequences WHERE aggregate_id = ?`, orderID))
	var rows []struct {
		Kind     string
		EventSeq int64
	}
	require.NoError(t, f.db.Raw(`SELECT kind, event_seq FROM notifications WHERE order_id = ? ORDER BY event_seq`, orderID).Scan(&rows).Error)
	require.Equal(t, []struct {
		Kind     string
		EventSeq int64
	}{{notify.KindOrderPaid, 2}, {notify.KindOrderRefunded, 3}}, rows)
}

// TestRefundOfAnUnknownOrderIsNotTransient: a refund event whose order does
// not exist fails inside the transaction; that is the message's fault, not
// the database's, so it is requeued toward the dead-letter queue instead of
// being retried in place for ever, and a good event of its batch is
// recorded.
func TestRefundOfAnUnknownOrderIsNotTransient(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.newConsumer(t)
	refunded := rabbitmq.Message{MessageID: "evt_refund_unknown", RoutingKey: "order.refunded",
		Body: []byte(`{"id":"evt_refund_unknown","type":"order.refunded","tenant_id":"acme","data":{"id":"rf_1","order_id":"ord_unknown","amount":1500}}`)}
	orderID, good := f.paidOrder(t)

	err := c.Handle(context.Background(), delivery(refunded))
	require.Error(t, err)
	require.False(t, rabbitmq.IsTransient(err), "a refund of an unknown order is the message's fault: %v", err)

	errs := c.HandleBatch(context.Background(), []amqp.Delivery{delivery(refunded), delivery(good)})
	require.Error(t, errs[0])
	require.False(t, rabbitmq.IsTransient(errs[0]))
	require.NoError(t, errs[1])
	require.Len(t, f.notifications(t, orderID), 1)
}

// TestDatabaseOutageFailsTheWholeBatchTransiently: when the database is
// unreachable no message is at fault; every delivery of the batch gets a
// transient error, so all are held and retried in place, none spent toward
// the dead-letter queue.
func TestDatabaseOutageFailsTheWholeBatchTransiently(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, m1 := f.paidOrder(t)
	_, m2 := f.paidOrder(t)
	c := consumerOfAGoneDatabase(t)
	for _, err := range c.HandleBatch(context.Background(), []amqp.Delivery{delivery(m1), delivery(m2)}) {
		require.Error(t, err)
		require.True(t, rabbitmq.IsTransient(err), "a database outage is transient: %v", err)
	}
}

// TestBatchRolledBackAfterItsInboxRecordsIsProcessedAgain: a batch's
// transaction fails after the inbox statement; nothing of it stays, and
// the same batch, redelivered, is recorded and notified in full.
func TestBatchRolledBackAfterItsInboxRecordsIsProcessedAgain(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.newConsumer(t)
	order1, m1 := f.paidOrder(t)
	order2, m2 := f.paidOrder(t)
	fail := true
	notify.SetAfterInbox(c, func() error {
		if fail {
			fail = false
			return errors.New("database failed after the inbox statement")
		}
		return nil
	})
	batch := []amqp.Delivery{delivery(m1), delivery(m2)}
	for _, err := range c.HandleBatch(context.Background(), batch) {
		require.Error(t, err)
	}
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM inbox`))
	require.Equal(t, 0, f.count(t, `SELECT count(*) FROM notifications`))
	require.Equal(t, []error{nil, nil}, c.HandleBatch(context.Background(), batch))
	require.Len(t, f.notifications(t, order1), 1)
	require.Len(t, f.notifications(t, order2), 1)
}
