package tracing

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Observe records v in obs with an exemplar {trace_id} when ctx's span is
// sampled (so that a latency bucket in Grafana leads to a trace that
// exists), else plainly. Exemplars are served in the OpenMetrics format
// (telemetry.MetricsHandler negotiates it).
func Observe(ctx context.Context, obs prometheus.Observer, v float64) {
	sc := trace.SpanContextFromContext(ctx)
	if eo, ok := obs.(prometheus.ExemplarObserver); ok && sc.IsSampled() {
		eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
		return
	}
	obs.Observe(v)
}
