package stack

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/notify/smtpsink"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/stripestep"
)

// Tenant is the tenant of Client and DirectClient (API key sk_test_acme).
const Tenant = "acme"

// Fault injects faults at the Stripe emulator (POST /_emulator/faults).
func (s *Stack) Fault(faults ...stripeemu.Fault) {
	s.t.Helper()
	b, _ := json.Marshal(faults)
	s.adminCall(http.MethodPost, "/_emulator/faults", b)
}

// Authenticate plays the customer's 3D Secure challenge for PaymentIntent
// id at the emulator (POST /_emulator/payment_intents/{id}/authenticate).
func (s *Stack) Authenticate(id string, succeed bool) {
	s.t.Helper()
	outcome := "fail"
	if succeed {
		outcome = "succeed"
	}
	s.adminCall(http.MethodPost, "/_emulator/payment_intents/"+id+"/authenticate", []byte(`{"outcome":"`+outcome+`"}`))
}

// ClearFaults removes every fault still active at the emulator.
func (s *Stack) ClearFaults() {
	s.t.Helper()
	s.adminCall(http.MethodDelete, "/_emulator/faults", nil)
}

func (s *Stack) adminCall(method, path string, body []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.EmulatorURL+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http30.Do(req)
	if err != nil {
		s.t.Fatalf("stack: emulator %s %s: %v", method, path, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		s.t.Fatalf("stack: emulator %s %s: %s %s", method, path, resp.Status, b)
	}
}

// Stats returns the emulator's GET /_emulator/stats.
func (s *Stack) Stats() stripeemu.Stats {
	s.t.Helper()
	var st stripeemu.Stats
	s.getJSON(s.EmulatorURL+"/_emulator/stats", &st)
	return st
}

// PaymentIntent is what the invariant checks read of one PaymentIntent in
// the emulator's state (GET /_emulator/state): Stripe's JSON, in part.
type PaymentIntent struct {
	ID       string            `json:"id"`
	Status   string            `json:"status"`
	Amount   int64             `json:"amount"`
	Metadata map[string]string `json:"metadata"`
	Created  int64             `json:"created"`
}

// PaymentIntents returns every PaymentIntent the emulator holds, with its
// metadata, not lagged like search (GET /_emulator/state).
func (s *Stack) PaymentIntents() []PaymentIntent {
	s.t.Helper()
	var st struct {
		PaymentIntents []PaymentIntent `json:"payment_intents"`
	}
	s.getJSON(s.EmulatorURL+"/_emulator/state", &st)
	return st.PaymentIntents
}

// Refund is what the invariant checks read of one refund in the
// emulator's state (GET /_emulator/state): Stripe's JSON, in part.
type Refund struct {
	ID            string `json:"id"`
	PaymentIntent string `json:"payment_intent"`
	Amount        int64  `json:"amount"`
	Status        string `json:"status"`
}

// Refunds returns every refund the emulator holds (GET /_emulator/state).
func (s *Stack) Refunds() []Refund {
	s.t.Helper()
	var st struct {
		Refunds []Refund `json:"refunds"`
	}
	s.getJSON(s.EmulatorURL+"/_emulator/state", &st)
	return st.Refunds
}

// IntentsByOrder groups pis by metadata[order_id].
func IntentsByOrder(pis []PaymentIntent) map[string][]PaymentIntent {
	m := map[string][]PaymentIntent{}
	for _, pi := range pis {
		m[pi.Metadata["order_id"]] = append(m[pi.Metadata["order_id"]], pi)
	}
	return m
}

// MoneyMoving counts the PaymentIntents of pis that moved or are moving
// money (succeeded, processing, requires_capture): at most one per order.
func MoneyMoving(pis []PaymentIntent) int {
	n := 0
	for _, pi := range pis {
		if stripeintent.Status(pi.Status).MovesMoney() {
			n++
		}
	}
	return n
}

// Orphans counts, over every order, the PaymentIntents that are neither the
// order's own (recorded in orders.payment_intent_id) nor canceled.
func (s *Stack) Orphans() int {
	s.t.Helper()
	recorded := map[string]string{}
	rows, err := s.DB.Query(context.Background(), `SELECT id, coalesce(payment_intent_id, '') FROM orders`)
	if err != nil {
		s.t.Fatalf("stack: orders: %v", err)
		return 0
	}
	for rows.Next() {
		var id, pi string
		if err := rows.Scan(&id, &pi); err != nil {
			s.t.Fatalf("stack: orders: %v", err)
		}
		recorded[id] = pi
	}
	rows.Close()
	n := 0
	for _, pi := range s.PaymentIntents() {
		if pi.Status != "canceled" && recorded[pi.Metadata["order_id"]] != pi.ID {
			n++
		}
	}
	return n
}

// Charges returns how many PaymentIntents of order orderID (by their
// metadata) move money at the emulator; the checkout's key is not needed
// any more (the Stripe keys derive from the order), and is kept for the
// callers' readability.
func (s *Stack) Charges(_, orderID string) int {
	s.t.Helper()
	return MoneyMoving(IntentsByOrder(s.PaymentIntents())[orderID])
}

// Intents returns how many PaymentIntents order orderID has at the
// emulator, whatever their status.
func (s *Stack) Intents(orderID string) int {
	s.t.Helper()
	return len(IntentsByOrder(s.PaymentIntents())[orderID])
}

// StepKey is the Stripe idempotency key of attempt 1 of step of order
// orderID (stripestep.Key).
func StepKey(orderID, step string) string {
	return stripestep.Key(orderID, step, 1)
}

// Messages returns the emails the SMTP sink accepted.
func (s *Stack) Messages() []smtpsink.Message {
	s.t.Helper()
	var ms []smtpsink.Message
	s.getJSON(s.SinkURL+"/messages", &ms)
	return ms
}

// EmailsFor counts the emails about order id in ms (by their subject,
// "Your order <id> is paid").
func EmailsFor(ms []smtpsink.Message, id string) int {
	n := 0
	for _, m := range ms {
		if m.Subject == "Your order "+id+" is paid" {
			n++
		}
	}
	return n
}

// MessageIDsFor returns, for the emails about order id in ms, how many
// times each Message-ID was accepted.
func MessageIDsFor(ms []smtpsink.Message, id string) map[string]int {
	ids := map[string]int{}
	for _, m := range ms {
		if m.Subject == "Your order "+id+" is paid" {
			ids[m.MessageID]++
		}
	}
	return ids
}

// Emails counts the emails the sink accepted about order id.
func (s *Stack) Emails(id string) int {
	s.t.Helper()
	return EmailsFor(s.Messages(), id)
}

func (s *Stack) getJSON(url string, v any) {
	s.t.Helper()
	resp, err := http30.Get(url)
	if err != nil {
		s.t.Fatalf("stack: GET %s: %v", url, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("stack: GET %s: %s", url, resp.Status)
		return
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		s.t.Fatalf("stack: GET %s: %v", url, err)
	}
}

// Key is the row of an idempotency key in Postgres.
type Key struct {
	RecoveryPoint string
	OrderID       string
	Status        int // the stored response's status, 0 while unfinished
}

// Key returns the row of the checkout key of Tenant, and whether it exists.
func (s *Stack) Key(key string) (Key, bool) {
	s.t.Helper()
	var k Key
	var orderID *string
	var status *int
	err := s.DB.QueryRow(context.Background(), `
		SELECT recovery_point, order_id, response_status FROM idempotency_keys
		WHERE tenant_id = $1 AND route = $2 AND key = $3`, Tenant, checkout.Route, key).
		Scan(&k.RecoveryPoint, &orderID, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		return k, false
	}
	if err != nil {
		s.t.Fatalf("stack: key %s: %v", key, err)
	}
	if orderID != nil {
		k.OrderID = *orderID
	}
	if status != nil {
		k.Status = *status
	}
	return k, true
}

// Count runs a SELECT count(*) … and returns its result.
func (s *Stack) Count(query string, args ...any) int {
	s.t.Helper()
	var n int
	if err := s.DB.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		s.t.Fatalf("stack: %s: %v", query, err)
	}
	return n
}

// Orders is the number of orders in the database.
func (s *Stack) Orders() int {
	s.t.Helper()
	return s.Count(`SELECT count(*) FROM orders`)
}

// OrderStatus returns the status of order id ("" when there is none).
func (s *Stack) OrderStatus(id string) string {
	s.t.Helper()
	var st string
	err := s.DB.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, id).Scan(&st)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		s.t.Fatalf("stack: order %s: %v", id, err)
	}
	return st
}

// Unpublished is the number of outbox rows not published yet.
func (s *Stack) Unpublished() int {
	s.t.Helper()
	return s.Count(`SELECT count(*) FROM outbox WHERE published_at IS NULL`)
}

// Quiesce waits until the background work is done: every outbox row
// published, every paid order's notification sent and its email at the
// sink. It returns an error naming what is left when timeout passes.
func (s *Stack) Quiesce(timeout time.Duration) error {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	var left string
	for {
		unpublished := s.Unpublished()
		unsent := s.Count(`SELECT count(*) FROM orders o WHERE o.status = 'paid' AND NOT EXISTS
			(SELECT 1 FROM notifications n WHERE n.order_id = o.id AND n.status = 'sent')`)
		paid := s.Count(`SELECT count(*) FROM orders WHERE status = 'paid'`)
		emailed := map[string]bool{}
		for _, m := range s.Messages() {
			emailed[m.Subject] = true
		}
		if unpublished == 0 && unsent == 0 && len(emailed) >= paid {
			return nil
		}
		left = fmt.Sprintf("%d outbox rows unpublished, %d paid orders without a sent notification, %d of %d paid orders emailed",
			unpublished, unsent, len(emailed), paid)
		if time.Now().After(deadline) {
			return fmt.Errorf("not quiet after %s: %s", timeout, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Metric returns the sum of the samples of a Prometheus counter or gauge
// named name whose labels include every label="value" pair given, from
// the text exposition at metricsURL (e.g. s.APIURL+"/metrics").
func Metric(metricsURL, name string, labels ...string) (float64, error) {
	resp, err := http30.Get(metricsURL)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		match := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				match = false
			}
		}
		if !match {
			continue
		}
		f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// RefundAtStripe is what the invariant checks read of one refund in the
// emulator's state (GET /_emulator/state).
type RefundAtStripe struct {
	ID            string            `json:"id"`
	Status        string            `json:"status"`
	Amount        int64             `json:"amount"`
	PaymentIntent string            `json:"payment_intent"`
	Metadata      map[string]string `json:"metadata"`
}

// RefundsAtStripe returns every refund the emulator holds.
func (s *Stack) RefundsAtStripe() []RefundAtStripe {
	s.t.Helper()
	var st struct {
		Refunds []RefundAtStripe `json:"refunds"`
	}
	s.getJSON(s.EmulatorURL+"/_emulator/state", &st)
	return st.Refunds
}
