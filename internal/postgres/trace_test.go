package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/tracing"
)

// TestIdleTransactionsAreNotTraced: a transaction or batch outside any
// trace (a sweep's, every 200ms in the worker) records no span under the
// sampler Setup installs, so a trace backend holds the checkouts, not the
// idle polls; inside a trace both are client spans of that trace. Not
// parallel: it installs the process's tracer provider.
func TestIdleTransactionsAreNotTraced(t *testing.T) {
	db, _ := pgtest.NewDB(t)
	sampler, err := tracing.Sampler(func(string) string { return "" })
	require.NoError(t, err)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sampler))
	t.Cleanup(tracing.Install(tp))
	require.NoError(t, tracing.InstrumentGORM(db))

	work := func(ctx context.Context) {
		require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error { return tx.Exec(`SELECT 1`).Error }))
		var b postgres.Batch
		b.Queue(`SELECT 1`, nil, nil)
		require.NoError(t, postgres.Send(ctx, db, &b))
	}
	work(context.Background())
	require.Empty(t, rec.Ended(), "a sweep's transaction and batch are not recorded")

	ctx, root := tracing.Start(context.Background(), "checkout")
	work(ctx)
	root.End()
	kinds := map[string]trace.SpanKind{}
	for _, sp := range rec.Ended() {
		require.Equal(t, root.SpanContext().TraceID(), sp.SpanContext().TraceID(), "%s joins the trace", sp.Name())
		kinds[sp.Name()] = sp.SpanKind()
	}
	require.Equal(t, trace.SpanKindClient, kinds["postgres.tx"])
	require.Equal(t, trace.SpanKindClient, kinds["postgres.batch"])
}
