package api_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/sweep"
	"github.com/onceonly/checkout/internal/tracing"
)

// capturing is an outbox.Publisher that confirms every message and keeps
// it, headers included.
type capturing struct {
	mu   sync.Mutex
	msgs []rabbitmq.Message
}

func (c *capturing) Publish(_ context.Context, msgs []rabbitmq.Message) []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, msgs...)
	return make([]error, len(msgs))
}

// keptMail is a notify.Mailer that accepts every email.
type keptMail struct {
	mu   sync.Mutex
	sent []notify.Email
}

func (m *keptMail) Send(_ context.Context, e notify.Email) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent = append(m.sent, e)
	return nil
}

// spans indexes the recorder's ended spans of one trace by span id.
type spans map[trace.SpanID]sdktrace.ReadOnlySpan

func (s spans) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, sp := range s {
		if sp.Name() == name {
			out = append(out, sp)
		}
	}
	return out
}

// chain is the names from sp up through its parents within s, ending with
// the id of the first parent not in s (the client's span).
func (s spans) chain(sp sdktrace.ReadOnlySpan) ([]string, trace.SpanID) {
	var names []string
	for {
		names = append(names, sp.Name())
		p, ok := s[sp.Parent().SpanID()]
		if !ok {
			return names, sp.Parent().SpanID()
		}
		sp = p
	}
}

func attr(sp sdktrace.ReadOnlySpan, key string) any {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.AsInterface()
		}
	}
	return nil
}

// TestOneCheckoutIsOneTrace runs one checkout through the API, the relay
// (with a publisher that keeps the messages), the notification consumer
// and the sender, under an in-process span recorder, and proves the parent
// chain: the SMTP send is the child of the worker's consume span, whose
// parent is the relay's publish span (through the AMQP headers), whose
// parent is the API span that wrote the outbox row (through its
// traceparent column), up to the request's server span and the client's
// span that sent the traceparent. Stripe's webhook about the order's
// PaymentIntent starts a trace of its own, linked to the checkout's. Not
// parallel: it installs the process's
// tracer provider.
func TestOneCheckoutIsOneTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(tracing.Install(tp))

	h := setup(t)
	require.NoError(t, tracing.InstrumentGORM(h.db))
	require.NoError(t, tracing.InstrumentRedis(h.rdb))

	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/checkouts", strings.NewReader(teeBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.Set("Idempotency-Key", "trace-1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
	r := h.send(req)
	require.Equal(t, 201, r.status, string(r.body))

	// The dispatcher's half, then the worker's.
	pub := &capturing{}
	relay, err := outbox.NewRelay(h.db, pub, outbox.RelayConfig{})
	require.NoError(t, err)
	n, err := relay.RelayBatch(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, n, "order.created and order.paid")
	consumer, err := notify.NewConsumer(h.db, notify.ConsumerConfig{})
	require.NoError(t, err)
	var deliveries []amqp.Delivery
	for _, m := range pub.msgs {
		require.Contains(t, m.Headers, "traceparent", "every event of a traced checkout carries its trace")
		deliveries = append(deliveries, amqp.Delivery{MessageId: m.MessageID, RoutingKey: m.RoutingKey, Body: m.Body, Headers: m.Headers})
	}
	for _, err := range consumer.HandleBatch(t.Context(), deliveries) {
		require.NoError(t, err)
	}
	mail := &keptMail{}
	sender, err := notify.NewSender(h.db, mail, notify.SenderConfig{From: "orders@checkout.local"})
	require.NoError(t, err)
	sent, err := sender.SendDue(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, sent)

	// The server span ends after the response is written: wait for it.
	byID := spans{}
	require.Eventually(t, func() bool {
		byID = spans{}
		for _, sp := range rec.Ended() {
			if sp.SpanContext().TraceID().String() == clientTrace {
				byID[sp.SpanContext().SpanID()] = sp
			}
		}
		return len(byID.named("POST /v1/checkouts")) == 1
	}, 10*time.Second, 10*time.Millisecond)

	server := byID.named("POST /v1/checkouts")[0]
	require.Equal(t, trace.SpanKindServer, server.SpanKind())
	require.Equal(t, clientSpan, server.Parent().SpanID().String(), "the API continues the client's traceparent")

	// Inside the request: the Redis lease, the database work, each Stripe
	// call with its key and attempt, and the HTTP request under it.
	var redisSpans int
	for _, sp := range byID {
		if sp.InstrumentationScope().Name == "github.com/redis/go-redis/extra/redisotel" {
			redisSpans++
		}
	}
	require.Positive(t, redisSpans, "the Redis lease")
	leases := byID.named("idempotency.lease")
	require.Len(t, leases, 1, "the lease is one span")
	names, root := byID.chain(leases[0])
	require.Equal(t, clientSpan, root.String())
	require.Equal(t, []string{"idempotency.lease", "POST /v1/checkouts"}, names)
	require.NotEmpty(t, append(byID.named("postgres.batch"), byID.named("postgres.tx")...), "the database work")
	for _, name := range []string{"stripe create", "stripe confirm"} {
		calls := byID.named(name)
		require.Len(t, calls, 1, name)
		require.NotEmpty(t, attr(calls[0], "stripe.idempotency_key"), name)
		require.EqualValues(t, 1, attr(calls[0], "stripe.attempt"), name)
		names, root = byID.chain(calls[0])
		require.Equal(t, clientSpan, root.String(), "%s under the request: %v", name, names)
		var requests int
		for _, sp := range byID {
			if sp.Parent().SpanID() == calls[0].SpanContext().SpanID() && sp.SpanKind() == trace.SpanKindClient {
				requests++
			}
		}
		require.Equal(t, 1, requests, "%s has its HTTP request (otelhttp) as a child", name)
	}

	// After the commit: publish, consume, inbox insert, SMTP send.
	sends := byID.named("smtp send")
	require.Len(t, sends, 1)
	names, root = byID.chain(sends[0])
	require.Equal(t, clientSpan, root.String(), "the email's chain reaches the client: %v", names)
	require.Equal(t, []string{"smtp send", "notify.order_paid process", "checkout.events publish"}, names[:3])
	require.Contains(t, names, "POST /v1/checkouts")
	consume := byID[sends[0].Parent().SpanID()]
	var inboxRecords int
	for _, sp := range byID.named("inbox.record") {
		if sp.Parent().SpanID() == consume.SpanContext().SpanID() {
			inboxRecords++
			require.Equal(t, true, attr(sp, "checkout.inbox.first"))
		}
	}
	require.Equal(t, 1, inboxRecords, "the inbox insert is the consume span's child")
	require.Len(t, byID.named("checkout.events publish"), 2, "both events of the checkout are published in its trace")

	// Stripe's webhook about the PaymentIntent: a trace of its own, linked
	// to the checkout's.
	var pi string
	require.NoError(t, h.db.Raw(`SELECT payment_intent_id FROM orders`).Scan(&pi).Error)
	_, payload := h.event("payment_intent.succeeded", pi)
	webhookOutcome(t, h.deliverSigned(payload))
	var linked bool
	require.Eventually(t, func() bool {
		for _, sp := range rec.Ended() {
			if sp.Name() != "POST /v1/webhooks/stripe" {
				continue
			}
			require.NotEqual(t, clientTrace, sp.SpanContext().TraceID().String(), "the webhook's own trace")
			for _, l := range sp.Links() {
				linked = linked || l.SpanContext.TraceID().String() == clientTrace
			}
			return true
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	require.True(t, linked, "the webhook's span links to the order's checkout trace")
}

// TestCompleterLinksToTheCheckoutTrace: a checkout left at order_created
// (Stripe unavailable: 502) is finished by the completer in a trace of its
// own, whose span links to the checkout's trace. Not parallel: it installs
// the process's tracer provider.
func TestCompleterLinksToTheCheckoutTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	t.Cleanup(tracing.Install(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
	h := setup(t, func(o *options) {
		o.stripe = &payments.Config{Timeout: time.Second, MaxElapsed: 100 * time.Millisecond}
	})
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPICreate, Status: 503}))
	const clientTrace = "5bf92f3577b34da6a3ce929d0e0e4737"
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/checkouts", strings.NewReader(teeBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.Set("Idempotency-Key", "trace-completer")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+clientTrace+"-00f067aa0ba902b8-01")
	r := h.send(req)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)

	h.emu.ClearFaults()
	require.NoError(t, h.db.Exec(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 hour'`).Error)
	c, err := sweep.NewCompleter(h.db, h.api.KeyStore, h.api.Service, sweep.CompleterConfig{Grace: time.Millisecond})
	require.NoError(t, err)
	round, err := c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.Round{Completed: 1}, round)

	var completes []sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		if sp.Name() == "completer complete" {
			completes = append(completes, sp)
		}
	}
	require.Len(t, completes, 1)
	sp := completes[0]
	require.NotEqual(t, clientTrace, sp.SpanContext().TraceID().String(), "a trace of its own")
	require.False(t, sp.Parent().IsValid(), "a root")
	require.Len(t, sp.Links(), 1)
	require.Equal(t, clientTrace, sp.Links()[0].SpanContext.TraceID().String(), "linked to the checkout's trace")
}
