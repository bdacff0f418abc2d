package payments

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/checkout/internal/telemetry"
)

// registerCalls creates the counter checkout_stripe_calls_total{op,result},
// incremented once per HTTP attempt (not per call), so retries show up as
// "transient" increments. op is one of create, confirm, cancel, retrieve,
// search; result one of succeeded, declined, transient, indeterminate,
// rejected. It is registered on reg unless reg is nil; when reg already has
// it, the registered one is used.
func registerCalls(reg prometheus.Registerer) *prometheus.CounterVec {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "checkout_stripe_calls_total",
		Help: "Stripe PaymentIntent HTTP attempts by op (create, confirm, cancel, retrieve, search) and result (succeeded, declined, transient, indeterminate, rejected); retries count once each.",
	}, []string{"op", "result"})
	calls = telemetry.Register(reg, calls)
	for _, o := range []op{opCreate, opConfirm, opCancel, opRetrieve, opSearch} {
		for _, r := range []result{resultSucceeded, resultDeclined, resultTransient, resultIndeterminate, resultRejected} {
			calls.WithLabelValues(string(o), string(r)) // export zeros so rates work from the start
		}
	}
	return calls
}

// stripeLogger adapts slog to stripe-go's LeveledLoggerInterface. Everything
// goes to Debug: the Client logs each failed attempt itself, once, and
// stripe-go's Debugf lines carry whole response bodies (client secrets), so
// they are dropped.
type stripeLogger struct{ l *slog.Logger }

// Debugf drops the message; see stripeLogger.
func (s stripeLogger) Debugf(string, ...any) {}

// Infof logs at Debug.
func (s stripeLogger) Infof(format string, v ...any) { s.log(format, v) }

// Warnf logs at Debug.
func (s stripeLogger) Warnf(format string, v ...any) { s.log(format, v) }

// Errorf logs at Debug.
func (s stripeLogger) Errorf(format string, v ...any) { s.log(format, v) }

func (s stripeLogger) log(format string, v []any) {
	if !s.l.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	s.l.Debug(fmt.Sprintf(format, v...), "source", "stripe-go")
}
