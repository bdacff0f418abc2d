package main

import (
	"context"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/notify/smtpsink"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/testenv"
)

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestBadValueStopsStartNamingTheVariable(t *testing.T) {
	t.Parallel()
	tests := map[string]map[string]string{
		"LOG_LEVEL":                 {"LOG_LEVEL": "loud"},
		"AMQP_URL":                  {"AMQP_URL": "http://rabbit"},
		"SMTP_ADDR":                 {"SMTP_ADDR": "mailpit"},
		"SMTP_FROM":                 {"SMTP_FROM": "not an address"},
		"SMTP_CONCURRENCY":          {"SMTP_CONCURRENCY": "0"},
		"METRICS_ADDR":              {"METRICS_ADDR": "9092"},
		"STRIPE_TIMEOUT":            {"STRIPE_TIMEOUT": "30s", "STRIPE_MAX_ELAPSED": "1s"},
		"STRIPE_API_BASE":           {"STRIPE_API_BASE": "notaurl"},
		"STRIPE_API_BASE ftp":       {"STRIPE_API_BASE": "ftp://x"},
		"STRIPE_MAX_ELAPSED":        {"STRIPE_MAX_ELAPSED": "soon"},
		"STRIPE_SEARCH_SETTLE":      {"STRIPE_SEARCH_SETTLE": "-1s"},
		"PAYMENT_UNKNOWN_AFTER":     {"PAYMENT_UNKNOWN_AFTER": "0s"},
		"PAYMENT_ACTION_TIMEOUT":    {"PAYMENT_ACTION_TIMEOUT": "never"},
		"RECONCILER_INTERVAL":       {"RECONCILER_INTERVAL": "0s"},
		"WORK_TIMEOUT":              {"WORK_TIMEOUT": "1s"},
		"NOTIFY_RETRY_FOR":          {"NOTIFY_RETRY_FOR": "0s"},
		"SMTP_TLS":                  {"SMTP_TLS": "ssl"},
		"SMTP_TLS_CA_FILE":          {"SMTP_TLS": "tls", "SMTP_TLS_CA_FILE": "/nonexistent/ca.pem"},
		"SMTP_TLS_CA_FILE none":     {"SMTP_TLS_CA_FILE": "main_test.go"},
		"SMTP_USERNAME":             {"SMTP_PASSWORD": "secret"},
		"SMTP_USERNAME clear text":  {"SMTP_ADDR": "smtp.example.com:587", "SMTP_USERNAME": "shop", "SMTP_PASSWORD": "secret"},
		"NOTIFY_RETRY_MAX_INTERVAL": {"NOTIFY_RETRY_MAX_INTERVAL": "soon"},
	}
	for name, env := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// A value that is not refused starts the worker, which waits
			// for its dependencies: the deadline turns that into a failure
			// (run returns nil) instead of a hang.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := run(ctx, getenv(env), io.Discard)
			want, _, _ := strings.Cut(name, " ") // "NAME case" names NAME
			require.ErrorContains(t, err, want)
		})
	}
}

// workerEnv starts an SMTP sink (closed in t's cleanup) and returns the
// environment of a worker on dbURL with this test's own exchange and
// queues (names), mailing to that sink, plus extra.
func workerEnv(t *testing.T, dbURL string, extra map[string]string) (map[string]string, rabbitmq.Names, *smtpsink.Sink) {
	t.Helper()
	names := rabbitmqtest.NewNames(t)
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	env := map[string]string{
		"DATABASE_URL": dbURL, "AMQP_URL": rabbitmqtest.URL(), "METRICS_ADDR": "127.0.0.1:0",
		"AMQP_EXCHANGE": names.Exchange, "NOTIFY_QUEUE": names.NotifyQueue, "SMTP_ADDR": sink.Addr(),
	}
	maps.Copy(env, extra)
	return env, names, sink
}

// opsAddr waits for the ops server's address in the log.
func opsAddr(t *testing.T, out *testenv.Output) string {
	t.Helper()
	return "http://" + testenv.LogValue(t, out, "ops server listening", "addr")
}

func TestRunNotifiesServesOpsAndDrainsOnSIGTERM(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.NewDB(t)
	env, names, sink := workerEnv(t, dbURL, map[string]string{"SMTP_FROM": "shop@example.com"})
	out := &testenv.Output{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, getenv(env), out) }()
	t.Cleanup(cancel)
	base := opsAddr(t, out)

	orderID := ids.New("ord")
	require.NoError(t, db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES (?, 'acme', 'paid', 'buyer@example.com', 'usd', 1200, 'pm_card_visa', now(), now())`, orderID).Error)
	conn := rabbitmqtest.Dial(t, rabbitmqtest.URL())
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: names.Exchange})
	defer pub.Close()
	body := []byte(`{"id":"evt_1","type":"order.paid","tenant_id":"acme","data":{"id":"` + orderID + `","email":"buyer@example.com"}}`)
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{{MessageID: "evt_1", RoutingKey: "order.paid", Body: body}}))

	var ntfID string
	require.Eventually(t, func() bool {
		db.Raw(`SELECT id FROM notifications WHERE order_id = ? AND status = 'sent'`, orderID).Scan(&ntfID)
		return ntfID != ""
	}, 10*time.Second, 20*time.Millisecond, "notification sent")
	require.Equal(t, map[string]int{notify.MessageID(ntfID): 1}, sink.CountByMessageID())
	require.Equal(t, "shop@example.com", sink.Messages()[0].From)

	status, _ := testenv.Get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, status)
	status, text := testenv.Get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, status, text)
	status, text = testenv.Get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, text, "checkout_notify_emails_sent_total 1")

	cancel() // what SIGTERM does through signal.NotifyContext
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("run did not drain within 20s")
	}
}

// TestRefundRetryAfterDefault: REFUND_RETRY_AFTER's default is the refund
// service's own (refunds.DefaultRetryAfter, the 24 hours Stripe keeps a
// key's stored answer at least), so the two cannot drift apart.
func TestRefundRetryAfterDefault(t *testing.T) {
	t.Parallel()
	var s settings
	require.NoError(t, config.Load(func(string) string { return "" }, &s))
	require.Equal(t, refunds.DefaultRetryAfter, s.RefundRetryAfter)
}

// TestRequeueCommandSendsARejectedEmailOnce: the mail server refuses an
// order's email with a 550, which fails its notification (counted in
// /metrics); `worker requeue-notifications --order ID`, run while the
// worker runs, makes the running worker send it, once, with the same
// Message-ID. Run again, it finds nothing to requeue and sends nothing.
func TestRequeueCommandSendsARejectedEmailOnce(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.NewDB(t)
	env, _, sink := workerEnv(t, dbURL, map[string]string{"NOTIFY_SWEEP_INTERVAL": "50ms"})
	sink.RejectWith(550, 1)
	out := &testenv.Output{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dispatch(ctx, nil, getenv(env), out) }()
	t.Cleanup(func() { cancel(); <-done })
	base := opsAddr(t, out)

	orderID := ids.New("ord")
	require.NoError(t, db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES (?, 'acme', 'paid', 'buyer@example.com', 'usd', 1200, 'pm_card_visa', now(), now())`, orderID).Error)
	ntfID := ids.New("ntf")
	require.NoError(t, db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind)
		VALUES (?, ?, 'acme', 'email', 'buyer@example.com', 'pending', 'order_paid')`, ntfID, orderID).Error)
	status := func() string {
		var s string
		require.NoError(t, db.Raw(`SELECT status FROM notifications WHERE id = ?`, ntfID).Scan(&s).Error)
		return s
	}
	require.Eventually(t, func() bool { return status() == "failed" }, 10*time.Second, 20*time.Millisecond, "550 fails the notification")
	_, metrics := testenv.Get(t, base+"/metrics")
	require.Contains(t, metrics, `checkout_notify_notifications_failed_total{reason="rejected"} 1`)
	require.Zero(t, sink.Len())

	var cmdOut strings.Builder
	require.NoError(t, dispatch(context.Background(), []string{"requeue-notifications", "--order", orderID}, getenv(env), &cmdOut))
	require.Equal(t, "requeued 1 failed notifications of order "+orderID+"\n", cmdOut.String())
	require.Eventually(t, func() bool { return status() == "sent" }, 10*time.Second, 20*time.Millisecond, "requeued notification sent")
	require.Equal(t, map[string]int{notify.MessageID(ntfID): 1}, sink.CountByMessageID())

	cmdOut.Reset()
	require.NoError(t, dispatch(context.Background(), []string{"requeue-notifications"}, getenv(env), &cmdOut))
	require.Equal(t, "requeued 0 failed notifications\n", cmdOut.String())
	require.Equal(t, map[string]int{notify.MessageID(ntfID): 1}, sink.CountByMessageID())
}

func TestUnknownCommandIsRefused(t *testing.T) {
	t.Parallel()
	err := dispatch(context.Background(), []string{"requeue"}, getenv(nil), io.Discard)
	require.ErrorContains(t, err, `unknown command "requeue"`)
	err = dispatch(context.Background(), []string{"requeue-notifications", "extra"}, getenv(nil), io.Discard)
	require.ErrorContains(t, err, "unexpected arguments")
}

// TestSMTPLoginOverSTARTTLSFromSettings: a worker configured with
// SMTP_TLS=starttls, a private CA (SMTP_TLS_CA_FILE) and a wrong
// SMTP_PASSWORD keeps the email pending, retried, with the server's 535 in
// last_error; restarted with the right password, it delivers the email
// once, over TLS, logged in.
func TestSMTPLoginOverSTARTTLSFromSettings(t *testing.T) {
	t.Parallel()
	db, dbURL := pgtest.NewDB(t)
	names := rabbitmqtest.NewNames(t)
	serverCfg, caPEM, err := smtpsink.SelfSigned()
	require.NoError(t, err)
	sink, err := smtpsink.StartWith("127.0.0.1:0", smtpsink.Options{TLSConfig: serverCfg, Username: "shop", Password: "right"})
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, caPEM, 0o600))
	env := map[string]string{
		"DATABASE_URL": dbURL, "AMQP_URL": rabbitmqtest.URL(), "METRICS_ADDR": "127.0.0.1:0",
		"AMQP_EXCHANGE": names.Exchange, "NOTIFY_QUEUE": names.NotifyQueue, "NOTIFY_SWEEP_INTERVAL": "50ms",
		"SMTP_ADDR": sink.Addr(), "SMTP_TLS": "starttls", "SMTP_TLS_CA_FILE": caFile,
		"SMTP_USERNAME": "shop", "SMTP_PASSWORD": "wrong",
	}
	start := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- run(ctx, getenv(env), io.Discard) }()
		var once sync.Once
		stop = func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
		t.Cleanup(stop)
		return stop
	}

	orderID := ids.New("ord")
	require.NoError(t, db.Exec(`INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES (?, 'acme', 'paid', 'buyer@example.com', 'usd', 1200, 'pm_card_visa', now(), now())`, orderID).Error)
	ntfID := ids.New("ntf")
	require.NoError(t, db.Exec(`INSERT INTO notifications (id, order_id, tenant_id, channel, recipient, status, kind)
		VALUES (?, ?, 'acme', 'email', 'buyer@example.com', 'pending', 'order_paid')`, ntfID, orderID).Error)
	type row struct {
		Status    string
		Attempts  int
		LastError *string
	}
	load := func() (r row) {
		require.NoError(t, db.Raw(`SELECT status, attempts, last_error FROM notifications WHERE id = ?`, ntfID).Scan(&r).Error)
		return r
	}

	stop := start()
	require.Eventually(t, func() bool { return load().Attempts >= 3 }, 20*time.Second, 20*time.Millisecond, "retried")
	stop()
	r := load()
	require.Equal(t, "pending", r.Status, "a refused login is temporary")
	require.NotNil(t, r.LastError)
	require.Contains(t, *r.LastError, `login as "shop"`)
	require.Contains(t, *r.LastError, "535")
	require.Zero(t, sink.Len())

	env["SMTP_PASSWORD"] = "right"
	start()
	require.Eventually(t, func() bool { return load().Status == "sent" }, 20*time.Second, 20*time.Millisecond, "sent")
	require.Equal(t, map[string]int{notify.MessageID(ntfID): 1}, sink.CountByMessageID())
	m := sink.Messages()[0]
	require.True(t, m.TLS)
	require.Equal(t, "shop", m.User)
}
