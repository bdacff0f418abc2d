package tracing

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceContext is the W3C Trace Context propagator
// (https://www.w3.org/TR/trace-context/): the traceparent is what the
// outbox row and the notification row store and the AMQP headers carry.
var traceContext propagation.TraceContext

// TraceParent returns the W3C traceparent header value of ctx's span
// ("00-{trace id}-{span id}-{flags}"), or "" when ctx has no valid span
// context (tracing off, or outside any trace).
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	traceContext.Inject(ctx, c)
	return c["traceparent"]
}

// WithTraceParent returns ctx carrying traceparent as its remote parent
// span context, so that a span started from it is that span's child. An
// empty or malformed traceparent returns ctx unchanged.
func WithTraceParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// Link returns a link to the span of traceparent, and false when
// traceparent is empty or malformed.
func Link(traceparent string) (trace.Link, bool) {
	sc := trace.SpanContextFromContext(WithTraceParent(context.Background(), traceparent))
	if !sc.IsValid() {
		return trace.Link{}, false
	}
	return trace.Link{SpanContext: sc}, true
}

// LinkTo links ctx's span to the span of traceparent (an order's trace,
// for the webhook and the completer, which act on their own cause); it
// does nothing when either is missing.
func LinkTo(ctx context.Context, traceparent string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if l, ok := Link(traceparent); ok {
		span.AddLink(l)
	}
}

// InjectHeaders writes ctx's traceparent (and tracestate, if any) into
// headers, an AMQP message's header table; it does nothing outside a
// trace. headers must not be nil.
func InjectHeaders(ctx context.Context, headers map[string]any) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	c := propagation.MapCarrier{}
	traceContext.Inject(ctx, c)
	for k, v := range c {
		headers[k] = v
	}
}

// FromHeaders returns ctx carrying the span context of the traceparent in
// headers (an AMQP delivery's table; string values only), unchanged when
// there is none.
func FromHeaders(ctx context.Context, headers map[string]any) context.Context {
	c := propagation.MapCarrier{}
	for _, k := range traceContext.Fields() {
		if v, ok := headers[k].(string); ok {
			c[k] = v
		}
	}
	if len(c) == 0 {
		return ctx
	}
	return traceContext.Extract(ctx, c)
}
