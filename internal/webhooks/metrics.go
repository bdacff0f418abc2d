package webhooks

import "github.com/prometheus/client_golang/prometheus"

// Outcomes counted by checkout_stripe_webhooks_total.
const (
	// OutcomeApplied: the event moved our state forward (inbox recorded in
	// the same transaction).
	OutcomeApplied = "applied"
	// OutcomeDuplicate: the event id was already in the inbox; nothing changed.
	OutcomeDuplicate = "duplicate"
	// OutcomeStale: recorded, but our state was already as far as or
	// further than the event's (or Stripe's current) state; nothing changed.
	OutcomeStale = "stale"
	// OutcomeIgnored: a type the service does not handle, an object that is
	// not ours, or an informational event; answered 200, nothing recorded.
	OutcomeIgnored = "ignored"
	// OutcomeInvalidSignature: 400 invalid_signature; nothing read further.
	OutcomeInvalidSignature = "invalid_signature"
	// OutcomeError: 4xx/5xx other than a bad signature (database or Stripe
	// unavailable, a body too large or unreadable); Stripe resends.
	OutcomeError = "error"
)

// typeOther labels every event type the service does not handle, so that
// the type label has a bounded set of values.
const typeOther = "other"

// typeUnverified labels deliveries whose signature failed: their body is not
// trusted, so not even its type is read.
const typeUnverified = "unverified"

// Metrics are the handler's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	webhooks *prometheus.CounterVec
}

// NewMetrics registers on reg (which may be nil):
//
//	checkout_stripe_webhooks_total{type,outcome}  deliveries by event type (handled types, or "other") and outcome
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "checkout_stripe_webhooks_total",
		Help: "Stripe webhook deliveries, by event type and outcome (applied, duplicate, stale, ignored, invalid_signature, error).",
	}, []string{"type", "outcome"})}
	for _, typ := range handledTypes {
		for _, o := range []string{OutcomeApplied, OutcomeDuplicate, OutcomeStale, OutcomeIgnored, OutcomeError} {
			m.webhooks.WithLabelValues(typ, o)
		}
	}
	m.webhooks.WithLabelValues(typeOther, OutcomeIgnored)
	m.webhooks.WithLabelValues(typeUnverified, OutcomeInvalidSignature)
	m.webhooks.WithLabelValues(typeUnverified, OutcomeError)
	if reg != nil {
		reg.MustRegister(m.webhooks)
	}
	return m
}

func (m *Metrics) count(typ, outcome string) {
	if m == nil {
		return
	}
	if !handled(typ) && typ != typeUnverified {
		typ = typeOther
	}
	m.webhooks.WithLabelValues(typ, outcome).Inc()
}
