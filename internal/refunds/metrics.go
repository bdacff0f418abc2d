package refunds

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/checkout/internal/telemetry"
)

// Results of checkout_refund_reconciliations_total.
const (
	ReconcileFound  = "found"     // Stripe had the refund: adopted
	ReconcileNotYet = "not_found" // not at Stripe (yet): 502, looked for again later
	ReconcileParked = "parked"    // not at Stripe after RetryAfter: parked requires_attention, never resent
)

// Metrics counts what refunds do that operators must see. A nil *Metrics
// counts nothing.
type Metrics struct {
	reconciliations *prometheus.CounterVec
	duplicates      prometheus.Counter
	attention       prometheus.Gauge
}

// NewMetrics registers, on reg (or reuses what another Service registered):
//
//	checkout_refund_reconciliations_total{result}  indeterminate refund creates reconciled by listing, by result (found, not_found, parked)
//	checkout_refund_duplicates_at_stripe_total     Stripe refunds found for a refund of ours that already had one (a 500 rolled forward after another attempt was adopted)
//	checkout_refunds_requiring_attention           refunds parked requires_attention now (set by the refund reconciler's rounds, so 0 in the api)
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reconciliations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_refund_reconciliations_total",
			Help: "Indeterminate refund creates reconciled by listing the PaymentIntent's refunds, by result (found, not_found, parked).",
		}, []string{"result"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_refund_duplicates_at_stripe_total",
			Help: "Stripe refunds found carrying the refund_id of one of ours that already had a Stripe refund: money refunded twice, to look into.",
		}),
		attention: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "checkout_refunds_requiring_attention",
			Help: "Refunds in requires_attention: indeterminate at Stripe past REFUND_RETRY_AFTER and not found there; never resent, still reconciled. Set by the worker's refund reconciler.",
		}),
	}
	for _, r := range []string{ReconcileFound, ReconcileNotYet, ReconcileParked} {
		m.reconciliations.WithLabelValues(r)
	}
	m.reconciliations = telemetry.Register(reg, m.reconciliations)
	m.duplicates = telemetry.Register(reg, m.duplicates)
	m.attention = telemetry.Register(reg, m.attention)
	return m
}

func (m *Metrics) requiringAttention(n int64) {
	if m != nil {
		m.attention.Set(float64(n))
	}
}

func (m *Metrics) reconciled(result string) {
	if m != nil {
		m.reconciliations.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) duplicate(n int) {
	if m != nil && n > 0 {
		m.duplicates.Add(float64(n))
	}
}
