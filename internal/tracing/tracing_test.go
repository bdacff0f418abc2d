package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/onceonly/checkout/internal/tracing"
)

func getenv(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// TestSetupIsOffWithoutAnEndpoint: with no OTEL_* endpoint (or with the SDK
// disabled) Setup installs nothing: the global provider stays the no-op
// one and no instrumentation is added. Not parallel: the provider is the
// process's.
func TestSetupIsOffWithoutAnEndpoint(t *testing.T) {
	before := otel.GetTracerProvider()
	for _, vars := range []map[string]string{
		{},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
	} {
		shutdown, err := tracing.Setup(t.Context(), getenv(vars), "checkout-test")
		require.NoError(t, err)
		require.NoError(t, shutdown(t.Context()))
		require.False(t, tracing.Enabled(), "%v", vars)
		require.Equal(t, before, otel.GetTracerProvider(), "%v", vars)
		require.Empty(t, tracing.TraceParent(t.Context()))
	}
}

// TestSetupRefusesWhatItCannotDo: a value Setup cannot honour stops the
// process at start with the variable's name.
func TestSetupRefusesWhatItCannotDo(t *testing.T) {
	for name, vars := range map[string]map[string]string{
		"OTEL_EXPORTER_OTLP_PROTOCOL": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		"OTEL_TRACES_SAMPLER":         {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_SAMPLER": "sometimes"},
		"OTEL_TRACES_SAMPLER_ARG":     {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
	} {
		_, err := tracing.Setup(t.Context(), getenv(vars), "checkout-test")
		require.ErrorContains(t, err, name)
		require.False(t, tracing.Enabled())
	}
}

// TestLogsCarryTheTrace: a record logged inside a span carries its
// trace_id and span_id; one outside any span carries neither.
func TestLogsCarryTheTrace(t *testing.T) {
	t.Cleanup(tracing.Install(sdktrace.NewTracerProvider()))
	var buf bytes.Buffer
	logger := slog.New(tracing.LogHandler(slog.NewJSONHandler(&buf, nil)))
	ctx, span := tracing.Start(context.Background(), "work")
	logger.InfoContext(ctx, "inside")
	span.End()
	logger.InfoContext(context.Background(), "outside")

	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	require.Len(t, lines, 2)
	var in, out map[string]any
	require.NoError(t, json.Unmarshal(lines[0], &in))
	require.NoError(t, json.Unmarshal(lines[1], &out))
	require.Equal(t, span.SpanContext().TraceID().String(), in["trace_id"])
	require.Equal(t, span.SpanContext().SpanID().String(), in["span_id"])
	require.NotContains(t, out, "trace_id")
}

// TestTraceParentRoundTrip: what the outbox row stores and the AMQP
// headers carry makes the next span a child of the writer's.
func TestTraceParentRoundTrip(t *testing.T) {
	t.Cleanup(tracing.Install(sdktrace.NewTracerProvider()))
	ctx, writer := tracing.Start(context.Background(), "outbox.add")
	tp := tracing.TraceParent(ctx)
	writer.End()
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, tp)

	headers := map[string]any{}
	pctx, publish := tracing.Start(tracing.WithTraceParent(context.Background(), tp), "publish")
	tracing.InjectHeaders(pctx, headers)
	publish.End()
	_, consume := tracing.Start(tracing.FromHeaders(context.Background(), headers), "consume")
	consume.End()

	ro := consume.(sdktrace.ReadOnlySpan)
	require.Equal(t, writer.SpanContext().TraceID(), ro.SpanContext().TraceID())
	require.Equal(t, publish.SpanContext().SpanID(), ro.Parent().SpanID())
}

// TestObserveKeepsTheTraceAsExemplar: a latency observed inside a sampled
// span carries its trace id as the bucket's exemplar; one outside carries
// none.
func TestObserveKeepsTheTraceAsExemplar(t *testing.T) {
	t.Cleanup(tracing.Install(sdktrace.NewTracerProvider()))
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: []float64{1, 2}})
	ctx, span := tracing.Start(context.Background(), "request")
	tracing.Observe(ctx, hist, 0.5)
	span.End()
	tracing.Observe(context.Background(), hist, 1.5)

	var m dto.Metric
	require.NoError(t, hist.Write(&m))
	buckets := m.GetHistogram().GetBucket()
	require.Equal(t, "trace_id", buckets[0].GetExemplar().GetLabel()[0].GetName())
	require.Equal(t, span.SpanContext().TraceID().String(), buckets[0].GetExemplar().GetLabel()[0].GetValue())
	require.Nil(t, buckets[1].GetExemplar())
}
