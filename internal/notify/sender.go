package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/tracing"
)

// SenderConfig configures a Sender. Zero values get the defaults shown.
type SenderConfig struct {
	// From is the envelope and header sender ("orders@checkout.local").
	From string
	// BatchSize is how many due notifications one claim takes (40, at most
	// Concurrency).
	BatchSize int
	// Concurrency is how many emails are sent at once (80); the next batch
	// is claimed while earlier ones are being sent. Each send holds an SMTP
	// connection, so keep it under the server's limit per client (Postfix:
	// smtpd_client_connection_count_limit, 50 by default).
	Concurrency int
	// SweepInterval is how often the sender looks for due notifications
	// when nothing woke it: retries, expired claims, rows a crashed worker
	// left behind (1s).
	SweepInterval time.Duration
	// SendTimeout bounds one SMTP transaction (15s).
	SendTimeout time.Duration
	// ClaimTTL is how long a claimed notification stays "sending" before
	// another sender may take it over (60s). It must exceed SendTimeout, or
	// a slow send could be taken over and sent twice.
	ClaimTTL time.Duration
	// RetryFor is how long a notification whose sends fail temporarily (a
	// 4xx reply, a refused or dropped connection, a timeout; see Mailer) is
	// retried, from its first failure, before it is marked failed
	// (NOTIFY_RETRY_FOR, 72h: a mail provider down over a weekend loses no
	// email). A permanent refusal (ErrRejected) fails it at once.
	RetryFor time.Duration
	// MinRetry and MaxRetry bound the wait between two tries (2s,
	// NOTIFY_RETRY_MAX_INTERVAL 1m): it grows exponentially from MinRetry
	// (cenkalti/backoff/v5, with jitter) and never exceeds MaxRetry, so
	// mail flows again within MaxRetry of the server's return.
	MinRetry, MaxRetry time.Duration
	// Logger (default: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Sender sends the email of each due notification and records the outcome.
//
// A notification is due when it is pending and its next_attempt_at has
// passed, or when it is sending and its claim expired (its sender died). A
// claim is one committed UPDATE … FOR UPDATE SKIP LOCKED that sets status
// sending, claimed_until and attempts+1, so senders in any number of
// processes never send the same row at the same time. After the send the row
// becomes sent (with sent_at); or, after a temporary failure, pending again
// with a backoff, recording in failing_since when its failures began, and
// failed once they have lasted RetryFor; or failed at once after a
// permanent refusal (ErrRejected). Each outcome is written only if the claim is still the
// sender's (same attempts), so a sender that lost its claim cannot overwrite
// the newer owner's result.
type Sender struct {
	db     *gorm.DB
	mailer Mailer
	cfg    SenderConfig
	logger *slog.Logger
	wake   chan struct{}

	sent     prometheus.Counter
	failures *prometheus.CounterVec
	failed   *prometheus.CounterVec
}

// Labels of checkout_notify_send_failures_total (kind) and
// checkout_notify_notifications_failed_total (reason).
const (
	// FailureTemporary is a send that failed temporarily: retried.
	FailureTemporary = "temporary"
	// FailurePermanent is a send the server refused for good (ErrRejected).
	FailurePermanent = "permanent"
	// FailedRejected is a notification failed by a permanent refusal.
	FailedRejected = "rejected"
	// FailedRetryExpired is a notification whose temporary failures
	// lasted RetryFor.
	FailedRetryExpired = "retry_expired"
)

// NewSender returns a Sender of db's notifications through mailer. It
// returns an error if the metrics cannot be registered or ClaimTTL does not
// exceed SendTimeout.
func NewSender(db *gorm.DB, mailer Mailer, cfg SenderConfig) (*Sender, error) {
	if cfg.From == "" {
		cfg.From = "orders@checkout.local"
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 40
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 80
	}
	// Run holds a slot per claimed notification: a claim larger than the
	// slots would send more than Concurrency at once, and free slots it
	// never took.
	cfg.BatchSize = min(cfg.BatchSize, cfg.Concurrency)
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = time.Second
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = 15 * time.Second
	}
	if cfg.ClaimTTL <= 0 {
		cfg.ClaimTTL = 60 * time.Second
	}
	if cfg.ClaimTTL <= cfg.SendTimeout {
		return nil, fmt.Errorf("notify: claim ttl %s must exceed send timeout %s", cfg.ClaimTTL, cfg.SendTimeout)
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 72 * time.Hour
	}
	if cfg.MinRetry <= 0 {
		cfg.MinRetry = 2 * time.Second
	}
	if cfg.MaxRetry <= 0 {
		cfg.MaxRetry = time.Minute
	}
	cfg.MinRetry = min(cfg.MinRetry, cfg.MaxRetry)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Sender{
		db: db, mailer: mailer, cfg: cfg, logger: logger, wake: make(chan struct{}, 1),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_notify_emails_sent_total",
			Help: "Emails accepted by the SMTP server and marked sent.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_notify_send_failures_total",
			Help: "SMTP send attempts that failed, by kind: temporary (retried for NOTIFY_RETRY_FOR) or permanent (a 5xx refusal of the message).",
		}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_notify_notifications_failed_total",
			Help: "Notifications marked failed, by reason: rejected (a 5xx refusal) or retry_expired (temporary failures for NOTIFY_RETRY_FOR). `worker requeue-notifications` sends them again.",
		}, []string{"reason"}),
	}
	for _, k := range []string{FailureTemporary, FailurePermanent} {
		s.failures.WithLabelValues(k) // exported at 0 from the start
	}
	for _, r := range []string{FailedRejected, FailedRetryExpired} {
		s.failed.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{s.sent, s.failures, s.failed} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("notify: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Wake makes a running sender look for due notifications now. It never
// blocks.
func (s *Sender) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run sends due notifications until ctx ends, waking on Wake or every
// SweepInterval, then finishes the sends in flight and returns nil.
// Database errors are logged and retried at the next sweep.
//
// Claims overlap the sends of earlier ones: the next batch is claimed as
// soon as BatchSize of the Concurrency send slots are free, so every
// claimed notification starts sending at once (its claim cannot age toward
// ClaimTTL waiting for a slot) and the claim's round trip no longer stalls
// the sends.
func (s *Sender) Run(ctx context.Context) error {
	ticker := time.NewTicker(s.cfg.SweepInterval)
	defer ticker.Stop()
	slots := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	sendCtx := context.WithoutCancel(ctx)
	for {
		for ctx.Err() == nil {
			// Wait for BatchSize free slots (NewSender keeps BatchSize
			// within Concurrency), then claim.
			for range s.cfg.BatchSize {
				slots <- struct{}{}
			}
			batch, err := s.claim(sendCtx)
			for range s.cfg.BatchSize - len(batch) {
				<-slots
			}
			if err != nil {
				s.logger.Warn("notify: send batch failed", "err", err)
				break
			}
			for _, n := range batch {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-slots }()
					s.send(sendCtx, n)
				}()
			}
			if len(batch) < s.cfg.BatchSize {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		case <-ticker.C:
		}
	}
}

// due is one claimed notification with what its email says.
type due struct {
	ID           string
	OrderID      string
	Recipient    string
	Attempts     int
	Kind         string
	RefundID     *string
	AmountTotal  int64
	Currency     string
	RefundAmount *int64
	// TraceParent is the consume span that created the notification
	// ("" when none did); the send is its child.
	TraceParent string
}

// SendDue claims up to BatchSize due notifications, sends them and records
// each outcome. It returns how many it claimed. Sends run on a context
// detached from ctx's cancellation (each bounded by SendTimeout), so a
// shutdown finishes the batch instead of leaving claims to expire.
func (s *Sender) SendDue(ctx context.Context) (int, error) {
	ctx = context.WithoutCancel(ctx)
	batch, err := s.claim(ctx)
	if err != nil {
		return 0, err
	}
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, n := range batch {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.send(ctx, n)
		}()
	}
	wg.Wait()
	return len(batch), nil
}

// claim claims up to BatchSize due notifications (status sending, for
// ClaimTTL) and returns them.
func (s *Sender) claim(ctx context.Context) ([]due, error) {
	var batch []due
	// One statement, so it commits on its own: the claim is visible to other
	// senders before any email leaves.
	//
	// A notification waits while another of its order, created by an
	// earlier event, is still pending or sending, so an order's emails
	// leave in the order of its events: the refund email never before the
	// paid one (CONTRACT.md v2, "Events").
	err := s.db.WithContext(ctx).Raw(`UPDATE notifications n
		SET status = 'sending', attempts = n.attempts + 1,
		    claimed_until = now() + ?::interval, next_attempt_at = now() + ?::interval
		FROM (
			SELECT id FROM notifications d
			WHERE status IN ('pending', 'sending') AND next_attempt_at <= now()
			  AND NOT EXISTS (
				SELECT 1 FROM notifications p
				WHERE p.order_id = d.order_id AND p.channel = d.channel
				  AND p.status IN ('pending', 'sending')
				  AND coalesce(p.event_seq, 0) < coalesce(d.event_seq, 0))
			ORDER BY next_attempt_at
			LIMIT ?
			FOR UPDATE SKIP LOCKED
		) d
		WHERE n.id = d.id
		RETURNING n.id, n.order_id, n.recipient, n.attempts, n.kind, n.refund_id,
		          coalesce(n.order_amount, 0) AS amount_total, coalesce(n.currency, '') AS currency, n.refund_amount,
		          coalesce(n.traceparent, '') AS trace_parent`,
		s.cfg.ClaimTTL.String(), s.cfg.ClaimTTL.String(), s.cfg.BatchSize).Scan(&batch).Error
	if err != nil {
		return nil, fmt.Errorf("notify: claim: %w", err)
	}
	return batch, nil
}

// send sends one claimed notification and records the outcome. The send
// is a span, smtp send, the child of the span that created the
// notification: the checkout's trace ends with its email.
func (s *Sender) send(ctx context.Context, n due) {
	ctx, span := tracing.Start(tracing.WithTraceParent(ctx, n.TraceParent), "smtp send",
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
			tracing.AttrNotificationID.String(n.ID), tracing.AttrOrderID.String(n.OrderID),
			attribute.Int("checkout.notification.attempt", n.Attempts)))
	sctx, cancel := context.WithTimeout(ctx, s.cfg.SendTimeout)
	err := s.mailer.Send(sctx, s.email(n))
	cancel()
	tracing.End(span, err)
	if err == nil {
		s.markSent(ctx, n)
		return
	}

	s.recordFailure(ctx, n, err)
}

// recordFailure records a failed send of claimed notification n: failed at
// once after a permanent refusal; otherwise pending again after a backoff,
// or failed when its failures, counted from failing_since (set at the
// first), have lasted RetryFor.
func (s *Sender) recordFailure(ctx context.Context, n due, sendErr error) {
	permanent := errors.Is(sendErr, ErrRejected)
	kind, reason := FailureTemporary, FailedRetryExpired
	if permanent {
		kind, reason = FailurePermanent, FailedRejected
	}
	s.failures.WithLabelValues(kind).Inc()
	delay := s.retryDelay(n.Attempts)
	// SET reads the row as it was before the update: failing_since in the
	// CASE is the old value, NULL at the first failure.
	// first: this failure began the window (failing_since is now(), the
	// statement's transaction time, only when this statement set it).
	var out []struct {
		Status string
		First  bool
	}
	err := s.db.WithContext(ctx).Raw(`UPDATE notifications
		SET failing_since = coalesce(failing_since, now()),
		    status = CASE WHEN ? OR coalesce(failing_since, now()) <= now() - ?::interval THEN 'failed' ELSE 'pending' END,
		    last_error = ?, claimed_until = NULL, next_attempt_at = now() + ?::interval
		WHERE id = ? AND status = 'sending' AND attempts = ?
		RETURNING status, failing_since = now() AS first`,
		permanent, s.cfg.RetryFor.String(), truncate(sendErr.Error(), 1000), delay.String(), n.ID, n.Attempts).Scan(&out).Error
	if err != nil {
		s.logger.Error("notify: record send failure", "notification", n.ID, "err", err)
		return
	}
	if len(out) == 0 {
		s.logger.Warn("notify: claim lost before recording a send failure", "notification", n.ID, "err", sendErr)
		return
	}
	attrs := []any{"notification", n.ID, "order", n.OrderID, "attempts", n.Attempts, "err", sendErr}
	switch {
	case out[0].Status == "failed":
		s.failed.WithLabelValues(reason).Inc()
		s.logger.Error("notify: notification failed; `worker requeue-notifications` sends it again",
			append(attrs, "reason", reason)...)
	case out[0].First:
		s.logger.Warn("notify: send failed; retrying for NOTIFY_RETRY_FOR", append(attrs, "retry_for", s.cfg.RetryFor, "retry_in", delay)...)
	default:
		// A long outage retries every notification about once a
		// MaxRetry: one line each would flood the log. The first failure
		// and the final one are logged above; the metric counts each.
		s.logger.Debug("notify: send failed again", append(attrs, "retry_in", delay)...)
	}
}

// markSent records that n's email left. The email is already out, so a
// database that is briefly unreachable must not turn into a second email when
// the claim expires: the update is retried with backoff for up to half the
// claim's life. Only a process that dies between the SMTP server's "250 OK"
// and this update resends (with the same Message-ID, which receivers such as
// Gmail use to drop duplicates).
func (s *Sender) markSent(ctx context.Context, n due) {
	mark := func() (int64, error) {
		res := s.db.WithContext(ctx).Exec(`UPDATE notifications
			SET status = 'sent', sent_at = now(), claimed_until = NULL, last_error = NULL
			WHERE id = ? AND status = 'sending' AND attempts = ?`, n.ID, n.Attempts)
		return res.RowsAffected, res.Error
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 50*time.Millisecond, 2*time.Second
	rows, err := backoff.Retry(ctx, func() (int64, error) {
		rows, err := mark()
		if err != nil && !postgres.IsTransient(err) {
			return 0, backoff.Permanent(err)
		}
		return rows, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(s.cfg.ClaimTTL/2))
	switch {
	case err != nil:
		// The claim expires and the email goes again, with the same
		// Message-ID: at least once, never zero.
		s.logger.Error("notify: mark sent", "notification", n.ID, "err", err)
	case rows == 0:
		s.logger.Warn("notify: claim lost before mark sent", "notification", n.ID)
	default:
		s.sent.Inc()
	}
}

// email builds the message for n.
func (s *Sender) email(n due) Email {
	if n.Kind == KindOrderRefunded {
		var amount int64
		if n.RefundAmount != nil {
			amount = *n.RefundAmount
		}
		refundID := ""
		if n.RefundID != nil {
			refundID = *n.RefundID
		}
		return Email{
			MessageID: MessageID(n.ID),
			From:      s.cfg.From,
			To:        n.Recipient,
			Subject:   fmt.Sprintf("Your refund for order %s", n.OrderID),
			Body: fmt.Sprintf("We refunded part or all of your order.\n\nOrder: %s\nRefund: %s\nAmount refunded: %s\n",
				n.OrderID, refundID, formatAmount(amount, n.Currency)),
		}
	}
	return Email{
		MessageID: MessageID(n.ID),
		From:      s.cfg.From,
		To:        n.Recipient,
		Subject:   fmt.Sprintf("Your order %s is paid", n.OrderID),
		Body: fmt.Sprintf("Thank you for your order.\n\nOrder: %s\nAmount paid: %s\n",
			n.OrderID, formatAmount(n.AmountTotal, n.Currency)),
	}
}

// retryDelay is the wait after the attempts-th try failed: the
// attempts-th interval of an exponential backoff (cenkalti/backoff/v5,
// multiplier 2, jitter ±50%) from MinRetry, whose intervals are capped so
// that with the jitter none exceeds MaxRetry.
func (s *Sender) retryDelay(attempts int) time.Duration {
	const jitter = 0.5
	b := &backoff.ExponentialBackOff{
		InitialInterval:     s.cfg.MinRetry,
		RandomizationFactor: jitter,
		Multiplier:          2,
		MaxInterval:         time.Duration(float64(s.cfg.MaxRetry) / (1 + jitter)),
	}
	d := b.NextBackOff()
	// Doubling reaches any cap well within 64 steps.
	for i := 1; i < min(attempts, 64); i++ {
		d = b.NextBackOff()
	}
	return min(d, s.cfg.MaxRetry)
}

// MessageID returns the email Message-ID of a notification,
// "<notification-{id}@checkout.local>" (CONTRACT.md): the same on every
// attempt, so a receiver can drop a resend.
func MessageID(notificationID string) string {
	return "<notification-" + notificationID + "@checkout.local>"
}

// formatAmount renders minor units as "50.00 USD". It assumes two decimal
// places, true of every currency the catalog sells (usd).
func formatAmount(minor int64, currency string) string {
	sign := ""
	if minor < 0 {
		sign, minor = "-", -minor
	}
	return fmt.Sprintf("%s%d.%02d %s", sign, minor/100, minor%100, strings.ToUpper(currency))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
