package notify_test

import (
	"context"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

// TestRestartsWithABacklogDeadLetterNothing is issue 35's defect 3: a
// worker stopped with a backlog hands its prefetched deliveries back, and
// RabbitMQ 3.10 counts each hand-back toward the quorum queue's delivery
// limit, so five restarts dead-lettered healthy order.paid events. Only a
// failing handler may count (CONTRACT.md v4, "Events"): after five stops,
// each with one delivery in hand and the rest of 20 prefetched, nothing is
// dead-lettered and each order gets one email.
func TestRestartsWithABacklogDeadLetterNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const orders, restarts = 20, 5
	orderIDs := make([]string, orders)
	msgs := make([]rabbitmq.Message, orders)
	for i := range orders {
		orderIDs[i], msgs[i] = f.paidOrder(t)
	}
	f.publish(t, msgs...)

	for range restarts {
		// One delivery at a time, held inside its transaction until the
		// stop, so the other deliveries wait prefetched when it comes.
		svc, err := notify.NewService(f.db, f.conn, &notify.SMTPMailer{Addr: f.sink.Addr()}, notify.Config{
			Queue: f.names.NotifyQueue, Concurrency: 1, BatchSize: 1, Sender: f.senderConfig(),
			Registerer: prometheus.NewRegistry(),
		})
		require.NoError(t, err)
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		notify.SetServiceAfterInbox(svc, func() error {
			once.Do(func() { close(entered) })
			<-release
			return nil
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- svc.Run(ctx) }()
		<-entered
		cancel() // the stop: the delivery in hand finishes, the rest go back
		close(release)
		require.NoError(t, <-done)
	}

	f.startService(t)
	waitFor(t, func() bool {
		return f.count(t, `SELECT count(*) FROM notifications`) == orders || f.ready(t, f.names.NotifyDLQ) > 0
	}, "every order notified, or something dead-lettered")
	require.Equal(t, 0, f.ready(t, f.names.NotifyDLQ), "healthy events dead-lettered by restarts")
	for _, id := range orderIDs {
		f.requireOneEmailSent(t, id)
	}
	require.Equal(t, orders, f.sink.Len())
}
