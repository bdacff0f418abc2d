//go:build model

package model

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// check runs the invariants that hold after every step, whatever is still
// in flight: a key makes at most one order per retention period (by its
// buyer's email, unique to the key), at most one PaymentIntent per order
// moves money, each refund of ours is made at most once at Stripe, and
// Stripe never refunds more than a PaymentIntent took.
func (h *history) check() {
	h.t.Helper()
	h.observeKeys()
	perEmail := map[string]int{}
	for _, o := range h.orders() {
		perEmail[o.email]++
	}
	for _, k := range h.keys {
		if k.kind == checkoutKey && perEmail[k.email] > k.epochs {
			h.fail(invOneOrder, "key %s made %d orders in %d retention periods", k.value, perEmail[k.email], k.epochs)
		}
	}
	ours := h.ordersByID()
	pis := h.s.PaymentIntents()
	for id, group := range stack.IntentsByOrder(pis) {
		if _, ok := ours[id]; !ok {
			continue
		}
		if n := stack.MoneyMoving(group); n > 1 {
			h.fail(invOneCharge, "order %s: %d PaymentIntents move money: %+v", id, n, group)
		}
	}
	amount := map[string]int64{}
	for _, pi := range pis {
		if _, ok := ours[pi.Metadata["order_id"]]; ok {
			amount[pi.ID] = pi.Amount
		}
	}
	refunded := map[string]int64{}
	perRefund := map[string]int{}
	for _, rf := range h.s.RefundsAtStripe() {
		if _, ok := amount[rf.PaymentIntent]; !ok || rf.Status == "failed" || rf.Status == "canceled" {
			continue
		}
		refunded[rf.PaymentIntent] += rf.Amount
		if id := rf.Metadata["refund_id"]; id != "" {
			perRefund[id]++
			if perRefund[id] > 1 {
				h.fail(invRefundOnce, "refund %s was made %d times at Stripe", id, perRefund[id])
			}
		}
	}
	for pi, r := range refunded {
		if r > amount[pi] {
			h.fail(invRefundWithinPaid, "PaymentIntent %s of %d refunded %d", pi, amount[pi], r)
		}
	}
}

func (h *history) ordersByID() map[string]orderRow {
	m := map[string]orderRow{}
	for _, o := range h.orders() {
		m[o.id] = o
	}
	return m
}

// quiesceTimeout bounds the wait for every order of a history to reach a
// final status and every email to leave: the longest window (NOTIFY_RETRY_FOR)
// several times over, far more than a correct service needs. It was 20s
// until a CI run on a machine loaded by other work (a load average near
// 17 on 2 cores) ran out of it once, in a history rapid then replayed
// without a failure: a stuck order stays stuck for a minute as well as
// for 20s, so the wait only costs time when something is wrong.
const quiesceTimeout = 60 * time.Second

// keyFinishTimeout bounds the retries of one key until its final answer
// once every fault has ended (15s until that CI run, for the same reason).
const keyFinishTimeout = 45 * time.Second

// quiesce ends a history as a client and support would: every fault off,
// the mail server and every process back, every key retried until its
// final answer. Then, once the background work is done, it checks what
// holds at rest: every order in a final status; money moved only for
// orders paid (or refunded from paid), net of the refunds of stray
// payments; each order's amount_refunded is what Stripe refunded, and its
// status says so; each paid order has one email with one Message-ID (or a
// notification failed, counted and alerted on, after a mail outage longer
// than NOTIFY_RETRY_FOR); no event went to the dead-letter queue.
func (h *history) quiesce() {
	h.t.Helper()
	h.s.ClearFaults()
	h.s.ClearHookFaults()
	h.s.MailRestore()
	for _, p := range h.procs() {
		if !p.Running() {
			if err := p.Start(); err != nil {
				h.t.Fatalf("start %s: %v", p.Name, err)
			}
		}
	}
	for _, k := range h.keys {
		if k.final == nil && !h.untilFinal(k, keyFinishTimeout) {
			h.fail(invKeyFinishes, "key %s (%s) has no final answer %s after every fault ended", k.value, k.path, keyFinishTimeout)
		}
	}
	// Every key once more, as a client whose answer was lost: each must
	// replay its final answer (send checks it).
	for _, k := range h.keys {
		h.send(k, false)
	}
	deadline := time.Now().Add(quiesceTimeout)
	for {
		left := h.unsettled()
		if left == "" {
			break
		}
		if time.Now().After(deadline) && time.Now().After(h.lastClaim().Add(5*time.Second)) {
			h.fail(invAtRest, "not at rest %s after every fault ended: %s", quiesceTimeout, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
	h.check()
	h.checkMoney()
	h.checkEmails()
	h.checkDeadLetters()
}

// lastClaim is when the last claim of a notification of the history
// still sending ends. A worker killed while sending leaves its claim for
// the sender's claim TTL (60s, not configurable): at-least-once, not lost;
// quiesce waits for it to end.
func (h *history) lastClaim() time.Time {
	h.t.Helper()
	var t time.Time
	err := h.s.DB.QueryRow(context.Background(), `SELECT coalesce(max(n.claimed_until), 'epoch') FROM notifications n
		JOIN orders o ON o.id = n.order_id WHERE o.email LIKE $1 AND n.status = 'sending'`, h.prefix+"%").Scan(&t)
	if err != nil {
		h.t.Fatalf("notifications: %v", err)
	}
	return t
}

// unsettled says what of the history is still moving: orders not in a
// final status, unpublished events, paid orders whose email is neither
// sent nor failed. "" when nothing is.
func (h *history) unsettled() string {
	var left []string
	for _, o := range h.orders() {
		if o.status.Waiting() {
			left = append(left, fmt.Sprintf("order %s is %s", o.id, o.status))
		}
	}
	if n := h.s.Unpublished(); n > 0 {
		left = append(left, fmt.Sprintf("%d outbox rows unpublished", n))
	}
	if n := h.s.Count(`SELECT count(*) FROM orders o WHERE o.email LIKE $1 AND o.status IN ($2, $3, $4)
		AND NOT EXISTS (SELECT 1 FROM notifications n WHERE n.order_id = o.id AND n.kind = 'order_paid' AND n.status IN ('sent', 'failed'))`,
		h.prefix+"%", orders.Paid, orders.PartiallyRefunded, orders.Refunded); n > 0 {
		left = append(left, fmt.Sprintf("%d paid orders without their email sent or failed (notifications %v; %d messages in %s, %d in its dead-letter queue, %d dead letters recorded)",
			n, h.notificationStatuses(), dlqDepth(h, h.s.Names.NotifyQueue), h.s.Names.NotifyQueue, dlqDepth(h, h.s.Names.NotifyDLQ), h.deadLetters()-h.deadBefore))
	}
	return strings.Join(left, "; ")
}

// notificationStatuses counts the history's notifications by kind and
// status, for a failure's message.
func (h *history) notificationStatuses() map[string]int {
	rows, err := h.s.DB.Query(context.Background(), `SELECT n.kind || ':' || n.status, count(*) FROM notifications n
		JOIN orders o ON o.id = n.order_id WHERE o.email LIKE $1 GROUP BY 1`, h.prefix+"%")
	if err != nil {
		h.t.Fatalf("notifications: %v", err)
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			h.t.Fatalf("notifications: %v", err)
		}
		m[k] = n
	}
	return m
}

// checkMoney compares every order of the history with Stripe: money moves
// only for an order paid or refunded from paid (a stray payment of any
// other order refunded in full), and a paid order's amount_refunded, as
// GET /v1/orders/{id} shows it, is what Stripe refunded of its payment,
// its status partially_refunded or refunded accordingly.
func (h *history) checkMoney() {
	h.t.Helper()
	byOrder := h.intents()
	refunded := map[string]int64{}
	for _, rf := range h.s.RefundsAtStripe() {
		if rf.Status == "succeeded" {
			refunded[rf.PaymentIntent] += rf.Amount
		}
	}
	for _, o := range h.orders() {
		var moved, back int64
		for _, pi := range byOrder[o.id] {
			if stripeintent.Status(pi.Status).MovesMoney() {
				moved += pi.Amount
				back += refunded[pi.ID]
			}
		}
		if !o.status.PaidOnce() {
			if moved > back {
				h.fail(invMoneyOnlyForPaid, "order %s is %s but Stripe holds %d of it (%d moved, %d refunded)", o.id, o.status, moved-back, moved, back)
			}
			continue
		}
		view := h.view(o.id)
		want := orders.Paid
		switch {
		case back >= o.total:
			want = orders.Refunded
		case back > 0:
			want = orders.PartiallyRefunded
		}
		got := orders.Status(view.Status)
		if view.AmountRefunded != back || (got != want && !(h.failedSucceeded && want.CanMoveTo(got))) {
			h.fail(invRefundedAsStripe, "order %s of %d: Stripe refunded %d, the order says %s with amount_refunded %d (want %s)",
				o.id, o.total, back, view.Status, view.AmountRefunded, want)
		}
	}
}

// orderView is the part of GET /v1/orders/{id} checkMoney reads.
type orderView struct {
	Status         string `json:"status"`
	AmountRefunded int64  `json:"amount_refunded"`
}

func (h *history) view(id string) orderView {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.s.APIURL+"/v1/orders/"+id, nil)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatalf("get order %s: %v", id, err)
	}
	defer resp.Body.Close()
	var v orderView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
		h.t.Fatalf("get order %s: %s %v", id, resp.Status, err)
	}
	return v
}

// checkEmails requires one paid email, with one Message-ID, for each order
// paid (or refunded from paid), unless its notification failed for good
// after a mail outage longer than NOTIFY_RETRY_FOR (counted and alerted
// on); and none for any other order.
func (h *history) checkEmails() {
	h.t.Helper()
	msgs := h.s.Messages()
	for _, o := range h.orders() {
		ids := stack.MessageIDsFor(msgs, o.id)
		switch {
		case !o.status.PaidOnce() && len(ids) > 0:
			h.fail(invOneEmail, "order %s is %s but was emailed as paid: %v", o.id, o.status, ids)
		case o.status.PaidOnce() && len(ids) != 1:
			failed := h.s.Count(`SELECT count(*) FROM notifications WHERE order_id = $1 AND kind = 'order_paid' AND status = 'failed'`, o.id)
			if failed == 0 || len(ids) > 1 {
				h.fail(invOneEmail, "order %s is %s: %d paid emails (Message-IDs %v)", o.id, o.status, len(ids), ids)
			}
		}
	}
}

// checkDeadLetters requires that no event was dead-lettered during the
// history: none in the dead-letter queue, and no dead_letters row (where
// the worker records what it takes off that queue, CONTRACT.md v4) added
// since the history began. The histories have no handler that keeps
// failing, so a dead letter is a healthy event dead-lettered, e.g. by
// restarts handing deliveries back.
func (h *history) checkDeadLetters() {
	h.t.Helper()
	if n := dlqDepth(h, h.s.Names.NotifyDLQ); n > 0 {
		h.fail(invNoDeadLetter, "%d events in the dead-letter queue %s", n, h.s.Names.NotifyDLQ)
	}
	if n := h.deadLetters() - h.deadBefore; n > 0 {
		h.fail(invNoDeadLetter, "%d events recorded in dead_letters during the history", n)
	}
}

// deadLetters counts the rows of dead_letters, 0 where the table does not
// exist (code from before it).
func (h *history) deadLetters() int {
	h.t.Helper()
	if h.s.Count(`SELECT count(*) FROM pg_tables WHERE tablename = 'dead_letters'`) == 0 {
		return 0
	}
	return h.s.Count(`SELECT count(*) FROM dead_letters`)
}

// dlqDepth returns the number of messages in queue (a passive declare),
// the dead-letter queue or another.
func dlqDepth(h *history, queue string) int {
	h.t.Helper()
	n, err := rabbitmqtest.Ready(rabbitmqtest.URL(), queue)
	if err != nil {
		h.t.Fatalf("rabbitmq: %s: %v", queue, err)
	}
	return n
}
