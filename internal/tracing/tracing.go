// Package tracing is the service's OpenTelemetry plumbing: one trace per
// checkout, from the API's POST through the outbox row, the dispatcher's
// publish and the AMQP headers to the worker's inbox insert and SMTP send.
//
// Setup installs a tracer provider that exports over OTLP/HTTP when the
// standard variables name an endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; see
// https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/),
// and does nothing otherwise: the global provider then stays OpenTelemetry's
// no-op one, no instrumentation is installed (Enabled is false), and a
// request pays one context lookup where a traceparent would be written.
//
// How the processes join one trace (and why children, not links):
//   - the API's spans are children of the request's server span (otelgin),
//     which continues a traceparent sent by the client;
//   - outbox.Add stores the W3C traceparent of the span that wrote the event
//     with the row; the dispatcher's publish span is its child and puts its
//     own traceparent into the AMQP headers; the worker's consume span is
//     the child of that header, its inbox insert the consume span's child,
//     and the notification row keeps the consume span's traceparent, so the
//     SMTP send is its child too. Each of these is caused by exactly that
//     one event of that one checkout, so a child keeps them in the checkout's
//     trace, one waterfall from the click to the email; a re-publish after a
//     dispatcher restart shows as a second publish in the same trace, and
//     its redelivery as an inbox insert with checkout.inbox.first=false,
//     which is the exactly-once machinery made visible;
//   - the Stripe webhook and the completer act on their own cause (Stripe's
//     event; a lease that expired) and may touch any order, so they start a
//     trace of their own with a link to the order's (LinkTo): their latency
//     is not the checkout's, and a checkout's trace does not grow for days.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the spans this module starts
// by hand.
const ScopeName = "github.com/onceonly/checkout"

// enabled is set by Setup when it installed an exporting provider.
var enabled atomic.Bool

// Enabled reports whether Setup installed an exporting tracer provider;
// the wiring (cmd/*) installs the contrib instrumentation only then.
func Enabled() bool { return enabled.Load() }

// Tracer is the tracer of the spans this module starts by hand.
func Tracer() trace.Tracer { return otel.Tracer(ScopeName) }

// Start starts a span named name as the child of ctx's span (Tracer().Start).
func Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return Tracer().Start(ctx, name, opts...)
}

// End ends span, recording err (if any) as its error status.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Shutdown flushes the spans still buffered and stops the exporter; it
// returns the exporter's error, if any, within ctx.
type Shutdown func(context.Context) error

// Setup installs the process's tracer provider from the standard OTEL_*
// variables read with getenv, serviceName being the default of
// OTEL_SERVICE_NAME, and the W3C trace-context propagator either way. With
// no endpoint set, or OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none,
// it installs nothing and returns a no-op Shutdown. It returns an error
// naming the variable for a value it cannot use:
// OTEL_EXPORTER_OTLP_PROTOCOL other than http/protobuf (the only one built
// in), or a bad OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG.
//
// The sampler is OTEL_TRACES_SAMPLER's (default parentbased_always_on)
// with one rule on top: a client span without a parent (a poll's SQL or
// transaction, a relay's claim, a sweep's Redis call) is not recorded, so
// the traces are the checkouts and their consequences, not every idle
// poll.
func Setup(ctx context.Context, getenv func(string) string, serviceName string) (Shutdown, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	noop := func(context.Context) error { return nil }
	endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	generic := getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" ||
		(endpoint == "" && generic == "") {
		return noop, nil
	}
	var errs []error
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	name := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	if proto == "" {
		proto, name = getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	if proto != "" && proto != "http/protobuf" {
		errs = append(errs, fmt.Errorf("%s: %q is not supported; use http/protobuf (OTLP over HTTP, port 4318)", name, proto))
	}
	if exp := getenv("OTEL_TRACES_EXPORTER"); exp != "" && exp != "otlp" {
		errs = append(errs, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported; use otlp or none", exp))
	}
	sampler, err := Sampler(getenv)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return noop, err
	}
	// The signal-specific variable is the full URL; the generic one is a
	// base to which /v1/traces is appended (the specification's rule).
	url := endpoint
	if url == "" {
		url = strings.TrimRight(generic, "/") + "/v1/traces"
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(url))
	if err != nil {
		return noop, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %w", err)
	}
	service := getenv("OTEL_SERVICE_NAME")
	if service == "" {
		service = serviceName
	}
	// resource.Default reads OTEL_RESOURCE_ATTRIBUTES and
	// OTEL_SERVICE_NAME from the process environment; the service name
	// set here wins for a process run with getenv from elsewhere (tests).
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil {
		return noop, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sampler),
	)
	Install(tp)
	return tp.Shutdown, nil
}

// Install makes tp the process's tracer provider and turns the
// instrumentation on (Enabled); Setup calls it with the exporting
// provider, tests with one around an in-process recorder
// (sdk/trace/tracetest). It returns the function that puts back the
// provider and the state of before.
func Install(tp trace.TracerProvider) (restore func()) {
	prev, wasEnabled := otel.GetTracerProvider(), enabled.Load()
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetTracerProvider(tp)
	enabled.Store(true)
	return func() {
		if !wasEnabled {
			// The global default delegates, once set, to the first
			// provider installed for good: a no-op one really is off.
			prev = noop.NewTracerProvider()
		}
		otel.SetTracerProvider(prev)
		enabled.Store(wasEnabled)
	}
}

// Sampler is the sampler Setup installs: OTEL_TRACES_SAMPLER with
// OTEL_TRACES_SAMPLER_ARG, as the specification names them, wrapped in
// skipOrphanClients. Tests install it around an in-process recorder to
// see what a process exports. It returns an error naming the variable
// for a value it cannot use.
func Sampler(getenv func(string) string) (sdktrace.Sampler, error) {
	ratio := func() (float64, error) {
		arg := getenv("OTEL_TRACES_SAMPLER_ARG")
		if arg == "" {
			return 1, nil
		}
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || f < 0 || f > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio between 0 and 1", arg)
		}
		return f, nil
	}
	var base sdktrace.Sampler
	switch s := getenv("OTEL_TRACES_SAMPLER"); s {
	case "", "parentbased_always_on":
		base = sdktrace.ParentBased(sdktrace.AlwaysSample())
	case "parentbased_always_off":
		base = sdktrace.ParentBased(sdktrace.NeverSample())
	case "always_on":
		base = sdktrace.AlwaysSample()
	case "always_off":
		base = sdktrace.NeverSample()
	case "traceidratio", "parentbased_traceidratio":
		f, err := ratio()
		if err != nil {
			return nil, err
		}
		base = sdktrace.TraceIDRatioBased(f)
		if s == "parentbased_traceidratio" {
			base = sdktrace.ParentBased(base)
		}
	default:
		return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio", s)
	}
	return skipOrphanClients{base}, nil
}

// skipOrphanClients drops a client span that has no parent (SQL, Redis or
// HTTP issued outside any traced operation: pollers and sweeps) and asks
// base about every other span.
type skipOrphanClients struct{ base sdktrace.Sampler }

func (s skipOrphanClients) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if p.Kind == trace.SpanKindClient && !trace.SpanContextFromContext(p.ParentContext).IsValid() {
		return sdktrace.SamplingResult{Decision: sdktrace.Drop}
	}
	return s.base.ShouldSample(p)
}

func (s skipOrphanClients) Description() string {
	return "SkipOrphanClients{" + s.base.Description() + "}"
}

// Attributes this module sets on its own spans.
var (
	// AttrIdempotencyKey is the Stripe idempotency key of a Stripe call.
	AttrIdempotencyKey = attribute.Key("stripe.idempotency_key")
	// AttrAttempt is the try of one Stripe call under one key, from 1.
	AttrAttempt = attribute.Key("stripe.attempt")
	// AttrOrderID is the order a span works on.
	AttrOrderID = attribute.Key("checkout.order_id")
	// AttrEventID is an outbox event's id (the AMQP message_id).
	AttrEventID = attribute.Key("checkout.event_id")
	// AttrEventType is an outbox event's type (its routing key).
	AttrEventType = attribute.Key("checkout.event_type")
	// AttrInboxFirst is whether the inbox saw a message for the first time
	// (false: a redelivery or re-publish, whose effects are skipped).
	AttrInboxFirst = attribute.Key("checkout.inbox.first")
	// AttrNotificationID is the notification an SMTP send delivers.
	AttrNotificationID = attribute.Key("checkout.notification_id")
)

// Flush calls shutdown with a deadline of 5 seconds, so that the spans of
// a process's last moments reach the collector, and logs its error: an
// unreachable collector loses spans, never the process's exit status.
func Flush(shutdown Shutdown, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		logger.Warn("tracing: spans not exported at shutdown", "err", err)
	}
}
