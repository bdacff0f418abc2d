package checkout

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceonly/checkout/internal/telemetry"
)

// Metrics counts what the payment saga cannot settle by itself. A nil
// *Metrics counts nothing.
type Metrics struct {
	unknownTotal     prometheus.Counter
	strayTotal       *prometheus.CounterVec
	strayUnreturned  prometheus.Gauge
	strayUnreturnedA *prometheus.GaugeVec
}

// Results counted by checkout_payments_stray_total.
const (
	StrayRefunded = "refunded" // refunded in full
	StrayCanceled = "canceled" // an uncaptured authorization canceled
	StrayFailed   = "failed"   // the refund or cancel failed (tried again), or no refund client
)

// NewMetrics registers on reg (reusing what another Service registered
// there already):
//
//	checkout_payments_unknown_total  orders moved to payment_unknown (PAYMENT_UNKNOWN_AFTER of failed reconciliation)
//	checkout_payments_stray_total{result}  PaymentIntents that moved money for an order that is not paid (refunded, canceled, failed)
//	checkout_payments_stray_unreturned  stray payments whose refund Stripe has not said succeeded (set by the reconciler's rounds)
//	checkout_payments_stray_unreturned_amount{currency}  what they charged and was not returned yet, in minor units
func NewMetrics(reg prometheus.Registerer) *Metrics {
	c := telemetry.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "checkout_payments_unknown_total",
		Help: "Orders whose payment outcome stayed unknown for PAYMENT_UNKNOWN_AFTER and became payment_unknown.",
	}))
	stray := telemetry.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "checkout_payments_stray_total",
		Help: "PaymentIntents that moved money for an order that is not paid (which the lifecycle forbids), by what was done: refunded, canceled (an authorization), failed.",
	}, []string{"result"}))
	for _, r := range []string{StrayRefunded, StrayCanceled, StrayFailed} {
		stray.WithLabelValues(r)
	}
	unreturned := telemetry.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "checkout_payments_stray_unreturned",
		Help: "Stray payments (money moved for an order that is not paid) whose refund Stripe has not said succeeded: failed (sent again under the next attempt's key), pending or unanswered. Set by the worker's reconciler.",
	}))
	amounts := telemetry.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "checkout_payments_stray_unreturned_amount",
		Help: "Money of stray payments not returned yet, in the currency's minor unit, by currency. Set by the worker's reconciler.",
	}, []string{"currency"}))
	return &Metrics{unknownTotal: c, strayTotal: stray, strayUnreturned: unreturned, strayUnreturnedA: amounts}
}

func (m *Metrics) stray(result string) {
	if m != nil {
		m.strayTotal.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) unknown() {
	if m != nil {
		m.unknownTotal.Inc()
	}
}

func (m *Metrics) unreturned(st strayStatus) {
	if m == nil {
		return
	}
	m.strayUnreturned.Set(float64(st.Unreturned))
	m.strayUnreturnedA.Reset()
	for cur, amount := range st.Amounts {
		m.strayUnreturnedA.WithLabelValues(cur).Set(float64(amount))
	}
}
