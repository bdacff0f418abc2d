// Command worker runs the background work after a checkout commits: the
// order events consumer and the notification sender (CONTRACT.md,
// "Events"), the completer (checkouts, cancellations and refunds whose
// process died), the reconciler (payments waiting for Stripe or the
// customer), the refund reconciler (refunds Stripe keeps pending) and the
// reaper (retention).
// Any number may run at once. It does not migrate: it waits until the API
// has created the schema.
//
// `worker requeue-notifications [-order ID]` sends failed notifications
// again (see requeue) and exits; `worker redrive-dead-letters [-id ID]
// [-message ID]` sends recorded dead letters through their queue again
// (see redrive) and exits.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/mail"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onceonly/checkout/internal/api"
	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/daemon"
	"github.com/onceonly/checkout/internal/deadletter"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/sweep"
	"github.com/onceonly/checkout/internal/telemetry"
	"github.com/onceonly/checkout/internal/tracing"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := dispatch(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// settings are the worker's environment variables (CONTRACT.md).
type settings struct {
	config.Shared
	rabbitmq.Settings
	SMTPAddr  string `env:"SMTP_ADDR" envDefault:"127.0.0.1:1025"`
	SMTPFrom  string `env:"SMTP_FROM" envDefault:"orders@checkout.local"`
	SMTPConns int    `env:"SMTP_CONCURRENCY" envDefault:"80"`
	// SMTPTLS is none, starttls or tls (notify.TLSNone ...); SMTPCAFile a
	// PEM bundle to trust instead of the system's roots (a private CA).
	SMTPTLS       string        `env:"SMTP_TLS" envDefault:"none"`
	SMTPCAFile    string        `env:"SMTP_TLS_CA_FILE"`
	SMTPUsername  string        `env:"SMTP_USERNAME"`
	SMTPPassword  string        `env:"SMTP_PASSWORD" secret:"true"`
	MetricsAddr   string        `env:"METRICS_ADDR" envDefault:":9092"`
	Prefetch      int           `env:"NOTIFY_PREFETCH" envDefault:"128"`
	SweepInterval time.Duration `env:"NOTIFY_SWEEP_INTERVAL" envDefault:"1s"`
	SequenceWait  time.Duration `env:"NOTIFY_SEQUENCE_WAIT" envDefault:"30s"`
	// Temporary SMTP failures are retried for RetryFor from the first,
	// waiting at most RetryMaxInterval between tries (CONTRACT.md v3).
	RetryFor         time.Duration `env:"NOTIFY_RETRY_FOR" envDefault:"72h"`
	RetryMaxInterval time.Duration `env:"NOTIFY_RETRY_MAX_INTERVAL" envDefault:"1m"`

	// The completer and the reconciler run the checkout's payment saga, so
	// they need what the API needs to call Stripe with the same keys,
	// parameters and timeouts.
	StripeAPIBase      string        `env:"STRIPE_API_BASE" envDefault:"http://127.0.0.1:12111"`
	StripeSecretKey    string        `env:"STRIPE_SECRET_KEY" envDefault:"sk_test_123" secret:"true"`
	StripeTimeout      time.Duration `env:"STRIPE_TIMEOUT" envDefault:"10s"`
	StripeMaxElapsed   time.Duration `env:"STRIPE_MAX_ELAPSED" envDefault:"20s"`
	StripeSettle       time.Duration `env:"STRIPE_SEARCH_SETTLE" envDefault:"60s"`
	UnknownAfter       time.Duration `env:"PAYMENT_UNKNOWN_AFTER" envDefault:"1h"`
	ActionTimeout      time.Duration `env:"PAYMENT_ACTION_TIMEOUT" envDefault:"30m"`
	WorkTimeout        time.Duration `env:"WORK_TIMEOUT" envDefault:"60s"`
	ReconcilerInterval time.Duration `env:"RECONCILER_INTERVAL" envDefault:"10s"`
	OrphanSweep        time.Duration `env:"ORPHAN_SWEEP_INTERVAL" envDefault:"1h"`
	IdempotencyTTL     time.Duration `env:"IDEMPOTENCY_TTL" envDefault:"24h"`
	IdempotencyLease   time.Duration `env:"IDEMPOTENCY_LEASE" envDefault:"30s"`
	CompleterInterval  time.Duration `env:"COMPLETER_INTERVAL" envDefault:"5s"`
	RefundRetryAfter   time.Duration `env:"REFUND_RETRY_AFTER" envDefault:"24h"`
	RefundPoll         time.Duration `env:"REFUND_POLL_INTERVAL" envDefault:"10s"`
	ReaperInterval     time.Duration `env:"REAPER_INTERVAL" envDefault:"1m"`
	InboxRetention     time.Duration `env:"INBOX_RETENTION" envDefault:"168h"`
	OutboxRetention    time.Duration `env:"OUTBOX_RETENTION" envDefault:"168h"`
}

// check validates what parsing cannot; each message names its variable.
func (s *settings) check() error {
	errs := append(s.Shared.Check(), s.Settings.Check()...)
	if _, _, err := net.SplitHostPort(s.SMTPAddr); err != nil {
		errs = append(errs, fmt.Errorf("SMTP_ADDR: %w", err))
	}
	errs = append(errs, s.checkSMTPLogin()...)
	if a, err := mail.ParseAddress(s.SMTPFrom); err != nil || a.Name != "" {
		errs = append(errs, fmt.Errorf("SMTP_FROM: %q is not a bare email address", s.SMTPFrom))
	}
	if _, _, err := net.SplitHostPort(s.MetricsAddr); err != nil {
		errs = append(errs, fmt.Errorf("METRICS_ADDR: %w", err))
	}
	if s.Prefetch < 1 || s.Prefetch > 1000 {
		errs = append(errs, errors.New("NOTIFY_PREFETCH: must be between 1 and 1000"))
	}
	if s.SMTPConns < 1 || s.SMTPConns > 1000 {
		errs = append(errs, errors.New("SMTP_CONCURRENCY: must be between 1 and 1000"))
	}
	if s.SweepInterval <= 0 {
		errs = append(errs, errors.New("NOTIFY_SWEEP_INTERVAL: must be positive"))
	}
	if s.SequenceWait <= 0 {
		errs = append(errs, errors.New("NOTIFY_SEQUENCE_WAIT: must be positive"))
	}
	if err := payments.CheckAPIBase(s.StripeAPIBase); err != nil {
		errs = append(errs, fmt.Errorf("STRIPE_API_BASE: %w", err))
	}
	if s.StripeSettle < 0 {
		errs = append(errs, fmt.Errorf("STRIPE_SEARCH_SETTLE: must not be negative, got %s", s.StripeSettle))
	}
	if s.StripeTimeout > s.StripeMaxElapsed {
		errs = append(errs, fmt.Errorf("STRIPE_TIMEOUT: %s exceeds STRIPE_MAX_ELAPSED (%s), so no retry could ever start", s.StripeTimeout, s.StripeMaxElapsed))
	}
	if s.WorkTimeout <= s.StripeMaxElapsed+s.StripeTimeout {
		errs = append(errs, fmt.Errorf("WORK_TIMEOUT: %s must exceed STRIPE_MAX_ELAPSED + STRIPE_TIMEOUT (%s)", s.WorkTimeout, s.StripeMaxElapsed+s.StripeTimeout))
	}
	for name, d := range map[string]time.Duration{
		"STRIPE_TIMEOUT": s.StripeTimeout, "STRIPE_MAX_ELAPSED": s.StripeMaxElapsed,
		"PAYMENT_UNKNOWN_AFTER": s.UnknownAfter, "PAYMENT_ACTION_TIMEOUT": s.ActionTimeout,
		"WORK_TIMEOUT": s.WorkTimeout, "RECONCILER_INTERVAL": s.ReconcilerInterval, "ORPHAN_SWEEP_INTERVAL": s.OrphanSweep,
		"IDEMPOTENCY_TTL": s.IdempotencyTTL, "IDEMPOTENCY_LEASE": s.IdempotencyLease,
		"COMPLETER_INTERVAL": s.CompleterInterval, "REAPER_INTERVAL": s.ReaperInterval,
		"REFUND_RETRY_AFTER": s.RefundRetryAfter, "REFUND_POLL_INTERVAL": s.RefundPoll,
		"INBOX_RETENTION": s.InboxRetention, "OUTBOX_RETENTION": s.OutboxRetention,
		"NOTIFY_RETRY_FOR": s.RetryFor, "NOTIFY_RETRY_MAX_INTERVAL": s.RetryMaxInterval,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive", name))
		}
	}
	return errors.Join(errs...)
}

// checkSMTPLogin validates SMTP_TLS, SMTP_TLS_CA_FILE, SMTP_USERNAME and
// SMTP_PASSWORD. As Go's net/smtp PlainAuth does, it refuses to send a
// password in clear text to any host but this one's loopback.
func (s *settings) checkSMTPLogin() []error {
	var errs []error
	switch s.SMTPTLS {
	case notify.TLSNone, notify.TLSStartTLS, notify.TLSImplicit:
	default:
		errs = append(errs, fmt.Errorf("SMTP_TLS: %q is not one of %s, %s, %s", s.SMTPTLS, notify.TLSNone, notify.TLSStartTLS, notify.TLSImplicit))
	}
	if s.SMTPCAFile != "" {
		if _, err := loadCA(s.SMTPCAFile); err != nil {
			errs = append(errs, fmt.Errorf("SMTP_TLS_CA_FILE: %w", err))
		}
		if s.SMTPTLS == notify.TLSNone {
			errs = append(errs, errors.New("SMTP_TLS_CA_FILE: set, but SMTP_TLS is none"))
		}
	}
	if s.SMTPPassword != "" && s.SMTPUsername == "" {
		errs = append(errs, errors.New("SMTP_USERNAME: empty, but SMTP_PASSWORD is set"))
	}
	if host, _, err := net.SplitHostPort(s.SMTPAddr); err == nil && s.SMTPUsername != "" && s.SMTPTLS == notify.TLSNone {
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			errs = append(errs, fmt.Errorf("SMTP_USERNAME: set with SMTP_TLS=none: the password would cross the network to %s in clear text; use starttls or tls", host))
		}
	}
	return errs
}

// loadCA reads a PEM bundle of certificates into a pool.
func loadCA(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// smtpMailer is the mailer the settings describe.
func (s *settings) smtpMailer() (*notify.SMTPMailer, error) {
	// As many idle sessions as sends at once: each send reuses one.
	m := &notify.SMTPMailer{Addr: s.SMTPAddr, MaxIdle: s.SMTPConns, TLS: s.SMTPTLS,
		Username: s.SMTPUsername, Password: s.SMTPPassword}
	if s.SMTPCAFile != "" {
		roots, err := loadCA(s.SMTPCAFile)
		if err != nil {
			return nil, fmt.Errorf("SMTP_TLS_CA_FILE: %w", err)
		}
		m.TLSConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return m, nil
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	var s settings
	if err := config.Load(getenv, &s); err != nil {
		return err
	}
	if err := s.check(); err != nil {
		return err
	}
	logger := telemetry.NewLogger(stdout, s.LogLevel).With("process", "worker")
	logger.Info("starting worker", config.Masked(&s)...)
	stopTracing, err := tracing.Setup(ctx, getenv, "checkout-worker")
	if err != nil {
		return err
	}
	defer tracing.Flush(stopTracing, logger)

	proc, err := daemon.Start(ctx, "worker", &s.Shared, &s.Settings, s.MetricsAddr, logger, "notifications", "inbox", "dead_letters")
	if err != nil || proc == nil {
		return err // nil: stopped while waiting for dependencies
	}
	defer proc.Close()
	db, conn, reg := proc.DB, proc.Conn, proc.Registry
	if err := tracing.InstrumentGORM(db); err != nil {
		return err
	}

	mailer, err := s.smtpMailer()
	if err != nil {
		return err
	}
	names := s.Names()
	notifier, err := notify.NewService(db, conn, mailer, notify.Config{
		Queue:           names.NotifyQueue,
		DeadLetterQueue: names.NotifyDLQ,
		FailureLimit:    names.DeliveryLimit,
		Prefetch:        s.Prefetch,
		SequenceWait:    s.SequenceWait,
		Sender: notify.SenderConfig{
			From:          s.SMTPFrom,
			Concurrency:   s.SMTPConns,
			SweepInterval: s.SweepInterval,
			RetryFor:      s.RetryFor,
			MaxRetry:      s.RetryMaxInterval,
		},
		Logger:     logger,
		Registerer: reg,
	})
	if err != nil {
		return err
	}

	// What the notification consumer gives up on is recorded, counted and
	// alerted on, for `worker redrive-dead-letters`.
	deadLetters, err := deadletter.NewRecorder(db, conn, deadletter.RecorderConfig{
		Queue: names.NotifyDLQ, Logger: logger.With("loop", "dead-letters"), Registerer: reg,
	})
	if err != nil {
		return err
	}

	// The completer pushes forward checkouts whose process died, and the
	// reconciler payments that wait for Stripe or the customer, through the
	// same saga and with the same Stripe keys as a client retry.
	keys := &idempotency.Store{Lease: s.IdempotencyLease, TTL: s.IdempotencyTTL, Now: time.Now,
		Metrics: idempotency.NewMetrics(reg)}
	pay := payments.NewClient(payments.Config{APIBase: s.StripeAPIBase, SecretKey: s.StripeSecretKey,
		Timeout: s.StripeTimeout, MaxElapsed: s.StripeMaxElapsed}, logger, reg)
	svc := &checkout.Service{DB: db, Keys: keys, Payments: pay, Logger: logger, Now: time.Now,
		Saga:    checkout.SagaConfig{SearchSettle: s.StripeSettle, UnknownAfter: s.UnknownAfter, ActionTimeout: s.ActionTimeout},
		Metrics: checkout.NewMetrics(reg), StrayRefunds: api.StrayRefunds(pay)}
	// Refunds whose request died are finished the same way; refunds Stripe
	// keeps pending are polled until Stripe settles them.
	refundSvc := &refunds.Service{DB: db, Keys: keys, Stripe: pay, Logger: logger.With("loop", "refunds"),
		Now: time.Now, RetryAfter: s.RefundRetryAfter, Metrics: refunds.NewMetrics(reg)}
	// Every route that takes a key (checkout, cancel, refund) is resumed
	// here, through the API's one list of them.
	completer, err := sweep.NewCompleter(db, keys, api.Completer(db, svc, refundSvc), sweep.CompleterConfig{
		Interval:   s.CompleterInterval,
		Grace:      s.IdempotencyLease,
		KeyTimeout: s.WorkTimeout, // detached; a run cut by the drain stays resumable
		Logger:     logger.With("loop", "completer"),
		Registerer: reg,
	})
	if err != nil {
		return err
	}
	reconciler, err := sweep.NewReconciler(db, svc, sweep.ReconcilerConfig{
		Interval:     s.ReconcilerInterval,
		OrderTimeout: s.WorkTimeout,
		Grace:        s.IdempotencyLease,
		SweepEvery:   s.OrphanSweep,
		Logger:       logger.With("loop", "reconciler"),
		Registerer:   reg,
	})
	if err != nil {
		return err
	}
	reaper, err := sweep.NewReaper(db, sweep.ReaperConfig{
		Interval:        s.ReaperInterval,
		InboxRetention:  s.InboxRetention,
		OutboxRetention: s.OutboxRetention,
		Logger:          logger.With("loop", "reaper"),
		Registerer:      reg,
	})
	if err != nil {
		return err
	}

	logger.Info("worker running")
	// One line per background loop; each returns after its work in flight.
	err = daemon.RunLoops(ctx, s.ShutdownTimeout, logger,
		notifier.Run,
		deadLetters.Run,
		completer.Run,
		reconciler.Run,
		reaper.Run,
		func(ctx context.Context) error { return refundSvc.RunReconciler(ctx, s.RefundPoll) },
	)
	logger.Info("worker stopped", "err", err)
	return err
}
