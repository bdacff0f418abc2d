package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/internal/testenv"
)

// deleteQueue deletes queue as an operator's rabbitmqctl delete_queue
// would, from a connection of its own.
func (f *fixture) deleteQueue(t *testing.T, queue string) {
	t.Helper()
	conn := rabbitmqtest.Dial(t, rabbitmqtest.URL())
	ch, err := conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDelete(queue, false, false, false)
	require.NoError(t, err)
}

// TestNotifyQueueDeletedUnderRunningRelayAndWorkerLosesNothing: the
// notify queue is deleted while the dispatcher's relay and the worker run,
// each on its own connection as in production. The worker's consumer is
// canceled by the broker; it must resubscribe, declaring the queue again,
// and the relay must not mark published an event that reached no queue.
// Every order still gets exactly one email. Before, the worker's session
// hung on the canceled consumer, the queue stayed gone, and the relay's
// publishes were confirmed into nothing and marked published: no email.
//
// The second deletion happens with the worker stopped, so that the relay
// alone meets the missing queue: its first publish of the new order's
// events is returned (the row stays unpublished, its error recorded), and
// it declares the topology itself before the retry, which then lands in the
// new queue for the worker to handle when it is back.
func TestNotifyQueueDeletedUnderRunningRelayAndWorkerLosesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	dispatcher, worker := f.conn(t, rabbitmqtest.URL()), f.conn(t, rabbitmqtest.URL())
	logs := &testenv.Output{}
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	pub := rabbitmq.NewPublisher(dispatcher, rabbitmq.PublisherConfig{Exchange: f.names.Exchange, ConfirmTimeout: 2 * time.Second, Logger: logger})
	t.Cleanup(func() { pub.Close() })
	relay, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{
		PollInterval: 200 * time.Millisecond, BatchSize: 50,
		MinRetry: 50 * time.Millisecond, MaxRetry: 200 * time.Millisecond, Logger: logger,
	})
	require.NoError(t, err)
	run(t, relay.Run)
	stopWorker := run(t, f.newService(t, worker).Run)

	orderIDs := f.paidOrders(t, 1)
	sent := func(n int) func() bool {
		return func() bool { return f.count(t, `SELECT count(*) FROM notifications WHERE status = 'sent'`) == n }
	}
	waitFor(t, 10*time.Second, sent(1), "the first order's email")

	// Deleted under both; the next orders come while the worker resubscribes.
	f.deleteQueue(t, f.names.NotifyQueue)
	orderIDs = append(orderIDs, f.paidOrders(t, 5)...)
	waitFor(t, 20*time.Second, sent(6), "an email for every order after the deletion")

	// Deleted while the worker is down: only the relay can bring it back.
	stopWorker()
	f.deleteQueue(t, f.names.NotifyQueue)
	late := f.paidOrders(t, 1)
	orderIDs = append(orderIDs, late...)
	type attempt struct {
		ID        string
		Attempts  int
		Published bool
	}
	var rows []attempt
	waitFor(t, 10*time.Second, func() bool {
		require.NoError(t, f.db.Raw(`SELECT id, attempts, published_at IS NOT NULL AS published
			FROM outbox WHERE aggregate_id = ? ORDER BY seq`, late[0]).Scan(&rows).Error)
		return len(rows) == 2 && rows[0].Published && rows[1].Published
	}, "the late order's events published after the relay declared the queue again")
	for _, r := range rows {
		require.GreaterOrEqual(t, r.Attempts, 1, "the first publish, to no queue, failed: %+v", r)
		require.True(t, logged(logs, "outbox: publish failed", r.ID, "312 NO_ROUTE"), "%s failed as unroutable, not marked published", r.ID)
	}
	require.True(t, logged(logs, "rabbitmq: declared the topology again"))
	require.Equal(t, 2, f.ready(t, dispatcher, f.names.NotifyQueue), "both events wait in the new queue")

	run(t, f.newService(t, worker).Run)
	f.requireExactlyOneEmailPerOrder(t, worker, orderIDs, 20*time.Second)
	require.Equal(t, 2*len(orderIDs), f.count(t, `SELECT count(*) FROM inbox`), "each event handled once")
}

// logged reports whether one line of logs contains all of parts.
func logged(logs *testenv.Output, parts ...string) bool {
	for line := range strings.SplitSeq(logs.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}
