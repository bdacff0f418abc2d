package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/term"

	"github.com/onceonly/checkout/client"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
)

// demo holds what the steps share.
type demo struct {
	cfg  config
	out  io.Writer
	api  *client.Client
	sink sink
	n    int // the last step's number
	// bold, unbold are the terminal's escape codes for a step's title, ""
	// when out is no terminal (a file, a pipe: escape codes there are noise).
	bold, unbold string

	order string // the paid order of the first checkout
}

func newDemo(ctx context.Context, cfg config, out io.Writer) (*demo, error) {
	api, err := client.New(cfg.API, cfg.APIKey)
	if err != nil {
		return nil, fmt.Errorf("API: %w", err)
	}
	s, err := detectSink(ctx, cfg.Sink)
	if err != nil {
		return nil, err
	}
	d := &demo{cfg: cfg, out: out, api: api, sink: s}
	if cfg.Color && isTerminal(out) {
		d.bold, d.unbold = "\033[1m", "\033[0m"
	}
	d.printf("stack: %s; api %s, emails at %s, Stripe emulator %s\n", s.Name(), cfg.API, cfg.Sink, cfg.Emulator)
	return d, nil
}

// step prints the title of the next step.
func (d *demo) step(format string, args ...any) {
	d.n++
	fmt.Fprintf(d.out, "\n%s== %d. %s%s\n", d.bold, d.n, fmt.Sprintf(format, args...), d.unbold)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

// call prints how an answer came: status, attempts, replayed.
func (d *demo) call(c client.Call) {
	d.printf("HTTP %d after %d attempt(s), Idempotent-Replayed: %v", c.StatusCode, c.Attempts, c.Replayed)
	if c.Location != "" {
		d.printf(", Location: %s", c.Location)
	}
	d.printf("\n")
}

// problem prints an *Error as the caller sees it.
func (d *demo) problem(err error) (*client.Error, error) {
	var e *client.Error
	if !errors.As(err, &e) {
		return nil, err
	}
	d.printf("HTTP %d after %d attempt(s): code %s, %q\n", e.StatusCode, e.Attempts, e.Code, e.Detail)
	return e, nil
}

func (d *demo) json(v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	d.printf("%s\n", b)
}

var tees = client.CheckoutRequest{Email: "buyer@example.com", Items: []client.Item{{SKU: "sku_tee", Quantity: 2}}, PaymentMethod: "pm_card_visa"}

// checkout: a checkout, the same key again (replayed), the same key with
// another body (422).
func (d *demo) checkout(ctx context.Context) error {
	key := client.NewKey()
	d.step("client.CreateCheckout with a key made once for this purchase: %s", key)
	r, err := d.api.CreateCheckout(ctx, key, tees)
	if err != nil {
		return fmt.Errorf("checkout: %w", err)
	}
	d.call(r.Call)
	d.printf("order %s is %s, %d %s\n", r.Order.ID, r.Order.Status, r.Order.AmountTotal, r.Order.Currency)
	if r.StatusCode != http.StatusCreated || r.Replayed {
		return fmt.Errorf("checkout: want a first 201, got %d replayed=%v", r.StatusCode, r.Replayed)
	}
	d.order = r.Order.ID

	d.step("The same key and body again, as a retry after a lost answer would send them: the stored 201, replayed")
	again, err := d.api.CreateCheckout(ctx, key, tees)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	d.call(again.Call)
	if !again.Replayed || again.Order.ID != d.order {
		return fmt.Errorf("replay: want order %s replayed, got %s replayed=%v", d.order, again.Order.ID, again.Replayed)
	}
	d.printf("the same order %s: nothing ran twice\n", again.Order.ID)

	d.step("The same key with another body (3 tees): 422 idempotency_key_reused, a final answer, not retried")
	other := tees
	other.Items = []client.Item{{SKU: "sku_tee", Quantity: 3}}
	_, err = d.api.CreateCheckout(ctx, key, other)
	e, err := d.problem(err)
	if err != nil || e.Code != client.CodeIdempotencyKeyReused || e.Attempts != 1 {
		return fmt.Errorf("reused key: want one 422 idempotency_key_reused, got %v", err)
	}
	return nil
}

// untilOrder polls the order until ok holds (every 200ms, for up to d).
func (d *demo) untilOrder(ctx context.Context, id string, wait time.Duration, ok func(client.Order) bool) (client.Order, error) {
	deadline := time.Now().Add(wait)
	for {
		r, err := d.api.GetOrder(ctx, id)
		if err != nil {
			return client.Order{}, err
		}
		if ok(r.Order) || time.Now().After(deadline) {
			return r.Order, nil
		}
		select {
		case <-ctx.Done():
			return client.Order{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// sent counts o's notifications that were sent.
func sent(o client.Order) int {
	n := 0
	for _, x := range o.Notifications {
		if x.Status == "sent" {
			n++
		}
	}
	return n
}

// email waits for the paid email (outbox -> RabbitMQ -> worker -> SMTP)
// and finds exactly one at the sink.
func (d *demo) email(ctx context.Context) error {
	d.step("client.GetOrder until its email is sent (outbox -> RabbitMQ -> worker -> SMTP)")
	o, err := d.untilOrder(ctx, d.order, 20*time.Second, func(o client.Order) bool { return sent(o) >= 1 })
	if err != nil {
		return fmt.Errorf("order: %w", err)
	}
	d.json(o)
	if sent(o) < 1 {
		return fmt.Errorf("order %s: no email sent after 20s (is the dispatcher or the worker down?)", d.order)
	}
	return d.emails(ctx, "Emails about "+d.order+" at the SMTP sink (expect exactly 1)", d.order, 1)
}

// emails prints the emails about order id at the sink and checks that
// there are want of them.
func (d *demo) emails(ctx context.Context, title, id string, want int) error {
	d.step("%s", title)
	var ms []email
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if ms, err = d.sink.Emails(ctx, id); err != nil {
			return fmt.Errorf("sink: %w", err)
		}
		if len(ms) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, m := range ms {
		d.printf("%s  %s\n", m.MessageID, m.Subject)
	}
	if len(ms) != want {
		return fmt.Errorf("emails about %s: %d, want %d", id, len(ms), want)
	}
	return nil
}

// outbox shows the order's events as the outbox table holds them: what the
// dispatcher published to RabbitMQ, message_id and body byte for byte.
func (d *demo) outbox(ctx context.Context) error {
	dsn, why := d.cfg.databaseURL(d.sink)
	d.step("The order's events in the outbox table (%s)", why)
	db, err := postgres.Open(ctx, postgres.Config{URL: dsn, MaxConns: 1})
	if err != nil {
		return fmt.Errorf("outbox: cannot reach %s (%s): %w; set DATABASE_URL to the stack's database", redact(dsn), why, err)
	}
	defer postgres.Close(db)
	events, err := outbox.ForAggregate(ctx, db, d.order)
	if err != nil {
		return fmt.Errorf("outbox: %s (%s): %w; is DATABASE_URL the stack's database?", redact(dsn), why, err)
	}
	var paid []byte
	d.printf("%-36s %-14s %-8s %-9s %s\n", "message_id", "routing_key", "sequence", "published", "failed_publishes")
	for _, e := range events {
		d.printf("%-36s %-14s %-8d %-9v %d\n", e.ID, e.Type, e.Sequence, e.PublishedAt != nil, e.Attempts)
		if e.Type == outbox.TypeOrderPaid {
			paid = e.Payload
		}
	}
	if len(events) == 0 {
		return fmt.Errorf("outbox: %s (%s) has no event of order %s: it is not the database of the api at %s; set DATABASE_URL to it", redact(dsn), why, d.order, d.cfg.API)
	}
	var body bytes.Buffer
	if json.Indent(&body, paid, "", "  ") == nil {
		d.printf("the order.paid message body, as published:\n%s\n", body.String())
	}
	return nil
}

// redact hides a password in a database URL.
func redact(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil || cfg.Password == "" {
		return dsn
	}
	return strings.Replace(dsn, ":"+cfg.Password+"@", ":***@", 1)
}

// refund: a partial refund, its replay, one beyond what is left, and the
// refund email after the paid one.
func (d *demo) refund(ctx context.Context) error {
	key := client.NewKey()
	part := client.RefundRequest{Amount: 1500, Reason: client.ReasonRequestedByCustomer}
	d.step("client.CreateRefund: 15.00 of %s (key %s)", d.order, key)
	r, err := d.api.CreateRefund(ctx, d.order, key, part)
	if err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	d.call(r.Call)
	d.json(r.Refund)

	d.step("The same refund again (a client retry): the same 201, replayed; still one refund at Stripe")
	again, err := d.api.CreateRefund(ctx, d.order, key, part)
	if err != nil {
		return fmt.Errorf("refund replay: %w", err)
	}
	d.call(again.Call)
	if !again.Replayed || again.Refund.ID != r.Refund.ID {
		return fmt.Errorf("refund replay: want %s replayed, got %s replayed=%v", r.Refund.ID, again.Refund.ID, again.Replayed)
	}

	d.step("A refund of 40.00 when 35.00 is left: 409 refund_exceeds_payment (stored under its own key)")
	_, err = d.api.CreateRefund(ctx, d.order, "", client.RefundRequest{Amount: 4000})
	e, err := d.problem(err)
	if err != nil || e.Code != client.CodeRefundExceedsPayment {
		return fmt.Errorf("refund beyond the payment: want 409 refund_exceeds_payment, got %v", err)
	}
	if e.AmountRefundable != nil {
		d.printf("amount_refundable: %d\n", *e.AmountRefundable)
	}

	d.step("client.GetOrder until the refund email is sent too (order.refunded, sequenced after order.paid)")
	o, err := d.untilOrder(ctx, d.order, 20*time.Second, func(o client.Order) bool { return sent(o) >= 2 })
	if err != nil {
		return fmt.Errorf("order: %w", err)
	}
	d.printf("status %s, amount_refunded %d, notifications:\n", o.Status, o.AmountRefunded)
	d.json(o.Notifications)
	if sent(o) < 2 {
		return fmt.Errorf("order %s: the refund email was not sent after 20s", d.order)
	}
	return d.emails(ctx, "Emails about "+d.order+" (expect 2: paid, then refund)", d.order, 2)
}

// threeDSecure: a card that needs authentication answers 202; the customer
// passes the challenge at the emulator; Stripe's webhook settles the order.
func (d *demo) threeDSecure(ctx context.Context) error {
	d.step("3D Secure: 202 requires_action, the customer's challenge, settled by Stripe's webhook")
	req := client.CheckoutRequest{Email: "buyer@example.com", Items: []client.Item{{SKU: "sku_mug", Quantity: 1}},
		PaymentMethod: "pm_card_authenticationRequired"}
	r, err := d.api.CreateCheckout(ctx, "", req)
	if err != nil {
		return fmt.Errorf("3D Secure checkout: %w", err)
	}
	d.call(r.Call)
	pi := r.Order.Payment.PaymentIntentID
	if r.StatusCode != http.StatusAccepted || r.Order.Status != client.OrderRequiresAction || pi == "" {
		return fmt.Errorf("3D Secure checkout: want 202 requires_action with a PaymentIntent, got %d %s", r.StatusCode, r.Order.Status)
	}
	d.printf("order %s is requires_action; PaymentIntent %s waits for the customer (next_action %s)\n", r.Order.ID, pi, r.Order.Payment.NextAction.Type)

	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, d.cfg.Emulator+"/_emulator/payment_intents/"+pi+"/authenticate",
		strings.NewReader(`{"outcome":"succeed"}`))
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(hreq)
	if err != nil {
		return fmt.Errorf("authenticate at the emulator (EMU %s): %w", d.cfg.Emulator, err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("authenticate at the emulator: %s", resp.Status)
	}
	t0 := time.Now()
	o, err := d.untilOrder(ctx, r.Order.ID, 30*time.Second, func(o client.Order) bool { return o.Status == client.OrderPaid })
	if err != nil {
		return fmt.Errorf("order: %w", err)
	}
	d.printf("challenge passed at Stripe; order %s is %s %s later (the reconciler polls every 10s: sooner was the webhook)\n",
		o.ID, o.Status, time.Since(t0).Round(time.Millisecond))
	if o.Status != client.OrderPaid {
		return fmt.Errorf("3D Secure order %s: %s after 30s, want paid", o.ID, o.Status)
	}
	return nil
}
