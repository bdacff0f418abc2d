package idempotency

import "github.com/prometheus/client_golang/prometheus"

// Outcomes counted by checkout_idempotency_requests_total.
const (
	OutcomeNew      = "new"      // executed (first time, or resumed after a takeover)
	OutcomeReplayed = "replayed" // a stored response was replayed
	OutcomeInUse    = "in_use"   // 409: the key is executing elsewhere
	OutcomeReused   = "reused"   // 422: the key was used with another payload
	OutcomeMissing  = "missing"  // 400: no key
	OutcomeInvalid  = "invalid"  // 400: malformed key
	OutcomeFailed   = "failed"   // not stored: validation, transient failure; retry may succeed
)

// Metrics are the gateway's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	requests        *prometheus.CounterVec
	layer           *prometheus.CounterVec
	leaseExtensions *prometheus.CounterVec
	takeovers       prometheus.Counter
	redisErrors     *prometheus.CounterVec
}

// NewMetrics registers the gateway's series on reg:
//
//	checkout_idempotency_requests_total{route,outcome}
//	checkout_idempotency_duplicates_total{layer}        duplicates absorbed by redis or postgres
//	checkout_idempotency_lease_extensions_total{store}  store: redis, postgres
//	checkout_idempotency_takeovers_total                expired leases taken over
//	checkout_idempotency_redis_errors_total{mode}       Redis failures, by DEDUP_FAILURE_MODE
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_idempotency_requests_total",
			Help: "Requests through the idempotency gateway, by route and outcome.",
		}, []string{"route", "outcome"}),
		layer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_idempotency_duplicates_total",
			Help: "Duplicate requests (replayed, in use or reused) by the layer that answered them.",
		}, []string{"layer"}),
		leaseExtensions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_idempotency_lease_extensions_total",
			Help: "Lease extensions of slow requests, by store.",
		}, []string{"store"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "checkout_idempotency_takeovers_total",
			Help: "Keys whose expired lease was taken over to resume them.",
		}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "checkout_idempotency_redis_errors_total",
			Help: "Redis failures in the request path, by DEDUP_FAILURE_MODE.",
		}, []string{"mode"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.layer, m.leaseExtensions, m.takeovers, m.redisErrors)
	}
	return m
}

// expose creates every series of route at zero, so that /metrics shows
// them (and rate() works) before the first event of each kind.
func (m *Metrics) expose(route string) {
	if m == nil {
		return
	}
	for _, o := range []string{OutcomeNew, OutcomeReplayed, OutcomeInUse, OutcomeReused, OutcomeMissing, OutcomeInvalid, OutcomeFailed} {
		m.requests.WithLabelValues(route, o)
	}
	for _, l := range []string{"redis", "postgres"} {
		m.layer.WithLabelValues(l)
		m.leaseExtensions.WithLabelValues(l)
	}
	for _, mode := range []FailureMode{FailClosed, FailOpen} {
		m.redisErrors.WithLabelValues(string(mode))
	}
}

func (m *Metrics) outcome(route, outcome string) {
	if m != nil {
		m.requests.WithLabelValues(route, outcome).Inc()
	}
}

func (m *Metrics) duplicate(layer string) {
	if m != nil {
		m.layer.WithLabelValues(layer).Inc()
	}
}

func (m *Metrics) extended(store string) {
	if m != nil {
		m.leaseExtensions.WithLabelValues(store).Inc()
	}
}

// TakenOver counts one takeover of an expired lease.
func (m *Metrics) TakenOver() {
	if m != nil {
		m.takeovers.Inc()
	}
}

func (m *Metrics) redisError(mode FailureMode) {
	if m != nil {
		m.redisErrors.WithLabelValues(string(mode)).Inc()
	}
}
