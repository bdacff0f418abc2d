package notify

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
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
	// MaxAttempts is how many sends are tried before the notification is
	// marked failed (8).
	MaxAttempts int
	// MinRetry and MaxRetry bound the exponential delay between attempts
	// (2s, 10m): MinRetry·2^(attempts-1).
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
// becomes sent (with sent_at), or pending again with a backoff, or failed
// after MaxAttempts. Each outcome is written only if the claim is still the
// sender's (same attempts), so a sender that lost its claim cannot overwrite
// the newer owner's result.
type Sender struct {
	db     *gorm.DB
	mailer Mailer
	cfg    SenderConfig
	logger *slog.Logger
	wake   chan struct{}

	sent     prometheus.Counter
	failures prometheus.Counter
	failed   prometheus.Counter
}

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
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 8
	}
	if cfg.MinRetry <= 0 {
		cfg.MinRetry = 2 * time.Second
	}
	if cfg.MaxRetry <= 0 {
		cfg.MaxRetry = 10 * time.Minute
	}
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
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_notify_send_failures_total",
			Help: "SMTP send attempts that failed; the notification is retried or marked failed.",
		}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_notify_notifications_failed_total",
			Help: "Notifications given up after the maximum number of attempts.",
		}),
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
		) d, orders o
		WHERE n.id = d.id AND o.id = n.order_id
		RETURNING n.id, n.order_id, n.recipient, n.attempts, n.kind, n.refund_id, o.amount_total, o.currency,
		          (SELECT r.amount FROM refunds r WHERE r.id = n.refund_id) AS refund_amount`,
		s.cfg.ClaimTTL.String(), s.cfg.ClaimTTL.String(), s.cfg.BatchSize).Scan(&batch).Error
	if err != nil {
		return nil, fmt.Errorf("notify: claim: %w", err)
	}
	return batch, nil
}

// send sends one claimed notification and records the outcome.
func (s *Sender) send(ctx context.Context, n due) {
	sctx, cancel := context.WithTimeout(ctx, s.cfg.SendTimeout)
	err := s.mailer.Send(sctx, s.email(n))
	cancel()
	if err == nil {
		s.markSent(ctx, n)
		return
	}

	s.failures.Inc()
	final := n.Attempts >= s.cfg.MaxAttempts
	delay := s.retryDelay(n.Attempts)
	s.logger.Warn("notify: send failed", "notification", n.ID, "attempts", n.Attempts, "final", final, "err", err)
	res := s.db.WithContext(ctx).Exec(`UPDATE notifications
		SET status = CASE WHEN attempts >= ? THEN 'failed' ELSE 'pending' END,
		    last_error = ?, claimed_until = NULL, next_attempt_at = now() + ?::interval
		WHERE id = ? AND status = 'sending' AND attempts = ?`,
		s.cfg.MaxAttempts, truncate(err.Error(), 1000), delay.String(), n.ID, n.Attempts)
	if res.Error != nil {
		s.logger.Error("notify: record send failure", "notification", n.ID, "err", res.Error)
		return
	}
	if final && res.RowsAffected == 1 {
		s.failed.Inc()
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

// retryDelay is MinRetry·2^(attempts-1), capped at MaxRetry.
func (s *Sender) retryDelay(attempts int) time.Duration {
	d := s.cfg.MinRetry
	for i := 1; i < attempts && d < s.cfg.MaxRetry; i++ {
		d *= 2
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
