package orders

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripeintent"
)

// The orders' statements for a batch (postgres.Batch): the checkout's fast
// path writes a new order, its PaymentIntent and its payment in batches of
// several owners' statements, one round trip each.

// Guards of the orders' batch statements (postgres.IsGuard): the batch
// wrote nothing.
const (
	// GuardIntentTaken: the order records another PaymentIntent
	// (QueueRecordIntent).
	GuardIntentTaken = "orders_intent_taken"
	// GuardMoved: the order is no longer in a status the change may be made
	// from (QueueApply).
	GuardMoved = "orders_moved"
)

// insertStatements are the INSERTs of o, a new order (pending_payment), and
// of its items, with their arguments.
func insertStatements(o *Order) (order string, orderArgs []any, items string, itemArgs []any) {
	n := len(o.Items)
	lines, skus, quantities, unitAmounts, amounts := make([]int64, n), make([]string, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, it := range o.Items {
		lines[i], skus[i], quantities[i], unitAmounts[i], amounts[i] = int64(i+1), it.SKU, int64(it.Quantity), it.UnitAmount, it.Amount
	}
	return `INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, return_url, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, NULLIF(?, ''), ?, ?)`,
		[]any{o.ID, o.TenantID, string(o.Status), o.Email, o.Currency, o.AmountTotal, o.PaymentMethod, o.ReturnURL, o.CreatedAt, o.CreatedAt},
		`INSERT INTO order_items (order_id, line, sku, quantity, unit_amount, amount)
			SELECT ?, t.line, t.sku, t.quantity, t.unit_amount, t.amount
			FROM unnest(?::int[], ?::text[], ?::int[], ?::bigint[], ?::bigint[]) AS t (line, sku, quantity, unit_amount, amount)`,
		[]any{o.ID, postgres.IntArray(lines), postgres.TextArray(skus), postgres.IntArray(quantities), postgres.IntArray(unitAmounts), postgres.IntArray(amounts)}
}

// QueueInsert queues in b the INSERTs of o, a new order (pending_payment),
// and of its items. A duplicate id fails the batch.
func QueueInsert(b *postgres.Batch, o *Order) {
	order, orderArgs, items, itemArgs := insertStatements(o)
	b.Queue(order, orderArgs, nil)
	b.Queue(items, itemArgs, nil)
}

// QueueRecordIntent queues in b what RecordIntent does, for a run that
// knows no other PaymentIntent can be recorded (it holds the key): piID
// (in Stripe status piStatus) recorded as order id's; when the order
// records another one, the batch fails with GuardIntentTaken.
func QueueRecordIntent(b *postgres.Batch, id, piID string, piStatus stripeintent.Status, now time.Time) {
	b.QueueGuarded(GuardIntentTaken,
		recordIntentSQL+` AND (payment_intent_id IS NULL OR payment_intent_id = ?) RETURNING id`,
		append(recordIntentArgs(id, piID, piStatus, now), piID), nil)
}

// QueueRecordFirstIntent queues in b what RecordIntent does: piID (in
// Stripe status piStatus) recorded as order id's unless one is recorded
// already; *recorded reads the one recorded once b is sent (the first
// wins, so concurrent runs agree). For a batch of facts written whoever
// holds the key.
func QueueRecordFirstIntent(b *postgres.Batch, id, piID string, piStatus stripeintent.Status, now time.Time, recorded *string) {
	var got string
	b.Queue(recordIntentSQL+` RETURNING payment_intent_id`, recordIntentArgs(id, piID, piStatus, now),
		func(r pgx.Row) error { return r.Scan(&got) })
	b.AfterCommit(func() { *recorded = got })
}

// QueueApply queues in b what Apply does for o, which the caller has read
// or written in this run: the change ch of its status with the payment
// fields ch carries, and the event of the status reached. When the order
// is no longer in a status ch.To may be reached from, the batch fails with
// GuardMoved. It returns o as it is once b commits (o.Changed).
//
// A batch cannot read whether an order without a closed PaymentIntent has
// one, so a ch.To that leaves the way to paid (payment_failed, canceled)
// without ch.closes() is refused with ErrPaymentOpen, ErrNoTransition one
// that no status reaches, and nothing is queued then.
func QueueApply(ctx context.Context, b *postgres.Batch, o *Order, ch Change, now time.Time) (*Order, error) {
	if ch.To.LeavesTheWayToPaid() && !ch.closes() {
		return nil, fmt.Errorf("order %s to %q in a batch: %w", o.ID, ch.To, ErrPaymentOpen)
	}
	query, args, err := statement(o.ID, ch, now)
	if err != nil {
		return nil, err
	}
	next := o.Changed(ch, now)
	var event *outbox.Event
	if typ := ch.To.Event(); typ != "" {
		e := Event(typ, next, now)
		event = &e
	}
	b.QueueGuarded(GuardMoved, query+` RETURNING id`, args, nil)
	if event != nil {
		if err := outbox.Queue(ctx, b, *event); err != nil {
			return nil, err
		}
	}
	return next, nil
}

// closes reports whether ch itself says the order's PaymentIntent can no
// longer move money: Closed, or Stripe's status canceled
// (stripeintent.Canceled). An exit (LeavesTheWayToPaid) needs it, or an order
// without a PaymentIntent (Apply reads that).
func (ch Change) closes() bool { return ch.Closed || ch.PaymentStatus == stripeintent.Canceled }

// Changed returns a copy of o with ch applied as Apply's UPDATE applies it
// at now: what Load would read back after it.
func (o *Order) Changed(ch Change, now time.Time) *Order {
	next := *o
	next.Items = append([]OrderItem(nil), o.Items...)
	next.Status = ch.To
	if ch.PaymentIntentID != "" {
		next.Payment.PaymentIntentID = ch.PaymentIntentID
	}
	if ch.PaymentStatus != "" {
		next.Payment.Status = ch.PaymentStatus
	}
	next.Payment.NextAction, next.Payment.ClientSecret = nil, ""
	if ch.To == RequiresAction {
		// Shown only while the customer has something to do (as Load).
		next.Payment.NextAction, next.Payment.ClientSecret = ch.NextAction, ch.ClientSecret
		t := now.UTC()
		next.RequiresActionAt = &t
	}
	next.FailureCode, next.DeclineCode = ch.FailureCode, ch.DeclineCode
	if ch.To != PaymentUnknown {
		next.UnknownSince = nil
	}
	return &next
}
