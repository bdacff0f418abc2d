package deadletter

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// Queue is the dead-letter queue consumed ("notify.order_paid.dlq").
	Queue string
	// GaugeInterval is how often the unresolved gauge is read from the
	// table besides after each record (default 30s), so that a redrive by
	// the command shows.
	GaugeInterval time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger (default: discard).
	Logger *slog.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Recorder consumes a dead-letter queue into dead_letters and exports
// checkout_dead_letters_total and checkout_dead_letters_unresolved.
type Recorder struct {
	db       *gorm.DB
	consumer *rabbitmq.Consumer
	cfg      RecorderConfig
	logger   *slog.Logger

	recorded   *prometheus.CounterVec
	unresolved prometheus.Gauge
}

// NewRecorder returns a Recorder of cfg.Queue on conn, writing to db. It
// returns an error if the metrics cannot be registered.
func NewRecorder(db *gorm.DB, conn *rabbitmq.Conn, cfg RecorderConfig) (*Recorder, error) {
	if cfg.GaugeInterval <= 0 {
		cfg.GaugeInterval = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Recorder{db: db, cfg: cfg, logger: logger.With("dlq", cfg.Queue),
		recorded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_dead_letters_total",
			Help: "Dead-lettered events recorded in dead_letters, by queue they died in and reason (handler_failed, delivery_limit, ...).",
		}, []string{"queue", "reason"}),
		unresolved: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "checkout_dead_letters_unresolved",
			Help: "Dead letters recorded and not yet sent again by `worker redrive-dead-letters`.",
		}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.recorded, r.unresolved} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("deadletter: register metrics: %w", err)
			}
		}
	}
	// Few messages, each one transaction: one at a time keeps it simple.
	r.consumer = rabbitmq.NewConsumer(conn, rabbitmq.ConsumerConfig{Queue: cfg.Queue, Prefetch: 16, Concurrency: 1,
		Logger: logger}, r.Handle)
	return r, nil
}

// Run records dead letters and refreshes the unresolved gauge until ctx
// ends, then returns nil after the message in flight; it returns an error
// only if the broker Conn was closed under it.
func (r *Recorder) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(r.cfg.GaugeInterval)
		defer t.Stop()
		for {
			r.refresh(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	err := r.consumer.Run(ctx)
	<-done
	return err
}

// refresh reads the unresolved count into the gauge.
func (r *Recorder) refresh(ctx context.Context) {
	n, err := CountUnresolved(ctx, r.db)
	if err != nil {
		if ctx.Err() == nil {
			r.logger.Warn("deadletter: count unresolved", "err", err)
		}
		return
	}
	r.unresolved.Set(float64(n))
}

// Handle records one delivery of the dead-letter queue (a rabbitmq.Handler)
// and returns nil once the row is committed, so the delivery is acked
// only then. Every failure is the database's, since any message can be
// recorded: it is returned rabbitmq.Transient, so the delivery is kept and
// retried in place rather than requeued.
func (r *Recorder) Handle(ctx context.Context, d amqp.Delivery) error {
	l := letterOf(d, r.cfg.Queue)
	var first bool
	err := postgres.WithTx(ctx, r.db, func(tx *gorm.DB) error {
		var err error
		first, err = record(ctx, tx, l, r.cfg.Now())
		return err
	})
	if err != nil {
		return rabbitmq.Transient(err)
	}
	r.recorded.WithLabelValues(l.Queue, string(l.Reason)).Inc()
	r.logger.Error("deadletter: event dead-lettered; recorded for `worker redrive-dead-letters`",
		"message_id", l.MessageID, "queue", l.Queue, "routing_key", l.RoutingKey, "reason", l.Reason,
		"failures", l.Failures, "last_error", l.LastError, "first", first)
	r.refresh(ctx)
	return nil
}

// letterOf reads a delivery of the dead-letter queue dlq: the consumer's
// headers when it dead-lettered the message (rabbitmq.HeaderDeadLetteredFrom),
// else the broker's x-death history
// (https://www.rabbitmq.com/docs/dlx#effects).
func letterOf(d amqp.Delivery, dlq string) Letter {
	l := Letter{MessageID: d.MessageId, ContentType: d.ContentType, Failures: rabbitmq.Failures(d), Body: d.Body,
		Reason: ReasonUnknown}
	// The routing key it was first published with: the consumer's header,
	// else x-death's, else its type (the contract's type is the routing
	// key); never the DLQ's name it came in by.
	if rk, ok := d.Headers[rabbitmq.HeaderRoutingKey].(string); ok {
		l.RoutingKey = rk
	}
	if l.Body == nil {
		l.Body = []byte{}
	}
	if from, ok := d.Headers[rabbitmq.HeaderDeadLetteredFrom].(string); ok && from != "" {
		l.Queue, l.Reason = from, ReasonHandlerFailed
		l.LastError, _ = d.Headers[rabbitmq.HeaderLastError].(string)
	} else if deaths, ok := d.Headers["x-death"].([]any); ok && len(deaths) > 0 {
		// The newest death comes first.
		if death, ok := deaths[0].(amqp.Table); ok {
			l.Queue, _ = death["queue"].(string)
			reason, _ := death["reason"].(string)
			l.Reason = reasonOf(reason)
			if keys, ok := death["routing-keys"].([]any); ok && len(keys) > 0 && l.RoutingKey == "" {
				if k, ok := keys[0].(string); ok {
					l.RoutingKey = k
				}
			}
		}
	}
	if l.Queue == "" {
		l.Queue = dlq // no history: it can only go back where it was found
	}
	if l.MessageID == "" {
		l.MessageID = fmt.Sprintf("dlq-%s-%d", dlq, d.DeliveryTag) // a message without id still gets its row
	}
	if l.RoutingKey == "" {
		l.RoutingKey = d.Type
	}
	if l.RoutingKey == "" {
		l.RoutingKey = d.RoutingKey
	}
	headers, err := json.Marshal(d.Headers)
	if err != nil || d.Headers == nil {
		headers = []byte("{}")
	}
	l.Headers = headers
	return l
}
