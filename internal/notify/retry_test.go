package notify_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/testenv"
)

// metricValue is the value of the counter name{label="value"} in reg (0
// when absent).
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// retrySender runs a sender of f's notifications with fast retries
// (10ms..50ms) for retryFor, registered in a registry of its own, and
// returns the registry.
func (f *fixture) retrySender(t *testing.T, retryFor time.Duration, logs ...io.Writer) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := f.senderConfig()
	cfg.RetryFor = retryFor
	cfg.Registerer = reg
	if len(logs) > 0 {
		cfg.Logger = slog.New(slog.NewJSONHandler(logs[0], &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	run(t, f.newSender(t, cfg).Run)
	return reg
}

// pendingNotification inserts a paid order and its pending notification,
// as the consumer leaves them, and returns the order id.
func (f *fixture) pendingNotification(t *testing.T) string {
	t.Helper()
	orderID, msg := f.paidOrder(t)
	require.NoError(t, f.newConsumer(t).Handle(context.Background(), delivery(msg)))
	return orderID
}

// TestMailOutageLongerThanEightTriesLosesNoEmail: the mail server answers
// 451 to every message, then refuses connections, for longer than the
// eight tries the sender used to give up after, then recovers. The email
// arrives once, and its row says since when it was failing. The log has one
// warning for the whole outage, not one per try.
func TestMailOutageLongerThanEightTriesLosesNoEmail(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID := f.pendingNotification(t)
	f.sink.Reject(1 << 30)
	logs := &testenv.Output{}
	reg := f.retrySender(t, 0, logs) // the default, 72h

	// 451s: well past eight tries.
	waitFor(t, func() bool {
		rows := f.notifications(t, orderID)
		return rows[0].Attempts > 10
	}, "more than ten tries")
	// Connections refused: more tries.
	require.NoError(t, f.sink.Down())
	attempts := f.notifications(t, orderID)[0].Attempts
	waitFor(t, func() bool { return f.notifications(t, orderID)[0].Attempts > attempts+5 }, "tries against a closed port")
	n := f.notifications(t, orderID)[0]
	require.Contains(t, []string{"pending", "sending"}, n.Status, "a temporary failure never fails the notification within NOTIFY_RETRY_FOR")
	require.Contains(t, *n.LastError, "connection refused")

	f.sink.Reject(0)
	require.NoError(t, f.sink.Up())
	sent := f.requireOneEmailSent(t, orderID)
	require.Greater(t, sent.Attempts, 15)
	require.Equal(t, 1, f.sink.Len())
	require.Equal(t, 1, f.count(t, `SELECT count(*) FROM notifications WHERE order_id = ? AND failing_since IS NOT NULL AND failing_since < sent_at`, orderID),
		"failing_since keeps when the failures began")
	require.GreaterOrEqual(t, metricValue(t, reg, "checkout_notify_send_failures_total", "kind", notify.FailureTemporary), float64(15))
	require.Zero(t, metricValue(t, reg, "checkout_notify_notifications_failed_total", "reason", notify.FailedRetryExpired))
	require.Equal(t, 1, strings.Count(logs.String(), `"level":"WARN"`), logs.String())
	require.Contains(t, logs.String(), "retrying for NOTIFY_RETRY_FOR")
}

// TestTemporaryFailuresForRetryForFailTheNotification: a notification whose
// sends keep failing temporarily is failed once RetryFor has passed since
// its first failure, and counted with reason retry_expired.
func TestTemporaryFailuresForRetryForFailTheNotification(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID := f.pendingNotification(t)
	f.sink.Reject(1 << 30)
	start := time.Now()
	reg := f.retrySender(t, 500*time.Millisecond)

	waitFor(t, func() bool { return f.notifications(t, orderID)[0].Status == "failed" }, "notification failed")
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "not before RetryFor")
	n := f.notifications(t, orderID)[0]
	require.Contains(t, *n.LastError, "451")
	require.Equal(t, 1.0, metricValue(t, reg, "checkout_notify_notifications_failed_total", "reason", notify.FailedRetryExpired))
	require.Zero(t, f.sink.Len())
}

// TestPermanentRefusalFailsAtOnceAndRequeueSendsOnce: a 550 fails the
// notification at its first try, counted with reason rejected; the
// operator's requeue sends it once, with the same Message-ID, and a second
// requeue sends nothing more.
func TestPermanentRefusalFailsAtOnceAndRequeueSendsOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	orderID := f.pendingNotification(t)
	other := f.pendingNotification(t) // sent, and not touched by the requeue
	f.sink.RejectWith(550, 1)
	reg := f.retrySender(t, 0)

	waitFor(t, func() bool {
		return f.notifications(t, orderID)[0].Status == "failed" && f.notifications(t, other)[0].Status == "sent" ||
			f.notifications(t, other)[0].Status == "failed" && f.notifications(t, orderID)[0].Status == "sent"
	}, "one failed, one sent")
	if f.notifications(t, other)[0].Status == "failed" { // the sink refused whichever came first
		orderID, other = other, orderID
	}
	n := f.notifications(t, orderID)[0]
	require.Equal(t, 1, n.Attempts, "a permanent refusal is not retried")
	require.Contains(t, *n.LastError, "550")
	require.Equal(t, 1.0, metricValue(t, reg, "checkout_notify_notifications_failed_total", "reason", notify.FailedRejected))
	require.Equal(t, 1.0, metricValue(t, reg, "checkout_notify_send_failures_total", "kind", notify.FailurePermanent))
	require.Zero(t, f.sink.Count(notify.MessageID(n.ID)))

	requeued, err := notify.Requeue(context.Background(), f.db, orderID)
	require.NoError(t, err)
	require.Equal(t, 1, requeued)
	f.requireOneEmailSent(t, orderID)
	require.Zero(t, f.count(t, `SELECT count(*) FROM notifications WHERE order_id = ? AND failing_since IS NOT NULL`, orderID),
		"the requeue began a new retry window")

	requeued, err = notify.Requeue(context.Background(), f.db, "")
	require.NoError(t, err)
	require.Zero(t, requeued, "nothing failed any more")
	time.Sleep(200 * time.Millisecond) // several sweeps
	require.Equal(t, map[string]int{notify.MessageID(n.ID): 1, notify.MessageID(f.notifications(t, other)[0].ID): 1}, f.sink.CountByMessageID())
}
