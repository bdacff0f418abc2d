package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/stripeintent"
)

// events maps the statuses whose reaching emits an event to its type.
var events = map[Status]string{
	Paid:          outbox.TypeOrderPaid,
	PaymentFailed: outbox.TypeOrderPaymentFailed,
	Canceled:      outbox.TypeOrderCanceled,
}

// Change is one status change of an order and the payment fields that come
// with it.
type Change struct {
	// To is the status the order moves to.
	To Status
	// PaymentIntentID is the PaymentIntent the change is about; "" keeps
	// the recorded one.
	PaymentIntentID string
	// PaymentStatus is Stripe's status of it ("" keeps the recorded one).
	PaymentStatus stripeintent.Status
	// NextAction and ClientSecret are Stripe's, for requires_action only.
	NextAction   json.RawMessage
	ClientSecret string
	// FailureCode and DeclineCode say why an order leaves the way to paid
	// (payment_failed, canceled); they are cleared by any other change.
	FailureCode, DeclineCode string
	// Closed says the order's PaymentIntent can no longer move money
	// (canceled at Stripe, or the order has none). A change that leaves the
	// way to paid needs it, or PaymentStatus canceled: see ErrPaymentOpen.
	Closed bool
}

// ErrPaymentOpen is Apply's refusal of a change that leaves the way to paid
// (payment_failed, canceled) while the order's PaymentIntent may still move
// money: an order leaves the way to paid only after its PaymentIntent is
// closed at Stripe (canceled, or found succeeded: then it is paid), so this
// is a bug of the caller, never an outcome.
var ErrPaymentOpen = errors.New("the order's PaymentIntent is not closed")

// ErrNoTransition is returned for a change to a status no status may move
// to (pending_payment, where orders start), or one that is not a status.
var ErrNoTransition = errors.New("no transition to that status")

// Apply applies ch to order id inside tx, the caller's transaction, if the
// order's current status may move to ch.To (the transitions table), and
// adds the event that status emits (Status.Event: order.paid,
// order.payment_failed, order.canceled, with the order as it is after the
// change as its data) to the outbox in the same transaction. It returns
// the order as it is after the change, or nil when the order did not
// change: it is already at ch.To or past it, or never can be there (a
// refused transition is not an error: statuses only move forward, whoever
// applies them and in whatever order). It returns ErrNotFound for no such
// order, ErrNoTransition for a ch.To nothing moves to, and ErrPaymentOpen
// for an exit without Closed while the order has a PaymentIntent.
//
// The write is one conditional UPDATE (its WHERE clause names the statuses
// ch.To may be reached from), which locks the row until tx ends; the order
// and its items are then read back for the event and the caller. Commit
// makes the change and its event durable together; rollback forgets both,
// and applying the same change again later is safe.
func Apply(ctx context.Context, tx *gorm.DB, id string, ch Change, now time.Time) (*Order, error) {
	tx = tx.WithContext(ctx)
	if ch.To.LeavesTheWayToPaid() && !ch.closes() {
		// The lifecycle's rule, checked where every change is written: no
		// exit while the PaymentIntent is open.
		var cur []orderRow
		if err := tx.Select("status", "payment_intent_id").Where("id = ?", id).Limit(1).Find(&cur).Error; err != nil {
			return nil, fmt.Errorf("order %s to %s: %w", id, ch.To, err)
		}
		if len(cur) == 0 {
			return nil, fmt.Errorf("order %s: %w", id, ErrNotFound)
		}
		if !Status(cur[0].Status).CanMoveTo(ch.To) {
			return nil, nil // already past: the change applies nowhere
		}
		if cur[0].PaymentIntentID != nil || ch.PaymentIntentID != "" {
			return nil, fmt.Errorf("order %s to %s: %w", id, ch.To, ErrPaymentOpen)
		}
	}
	query, args, err := statement(id, ch, now)
	if err != nil {
		return nil, err
	}
	var rows []orderRow
	if err := tx.Raw(query+` RETURNING *`, args...).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("order %s to %s: %w", id, ch.To, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	if err := tx.Where("order_id = ?", id).Find(&rows[0].Items).Error; err != nil {
		return nil, fmt.Errorf("load items of order %s: %w", id, err)
	}
	o := rows[0].order()
	if typ := ch.To.Event(); typ != "" {
		if err := outbox.Add(ctx, tx, Event(typ, o, now)); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Event returns the outbox event of type typ about o at at, with o as its
// data: what Apply and QueueApply add.
func Event(typ string, o *Order, at time.Time) outbox.Event {
	return outbox.Event{Type: typ, OccurredAt: at, TenantID: o.TenantID, AggregateID: o.ID, Data: o}
}

// statement is the UPDATE of order id that ch makes, and its arguments,
// ending with its WHERE clause: it matches only an order in a status ch.To
// may be reached from. Apply checks the PaymentIntent first; QueueApply
// refuses exits.
func statement(id string, ch Change, now time.Time) (string, []any, error) {
	from := froms[ch.To]
	if len(from) == 0 {
		return "", nil, fmt.Errorf("order %s to %q: %w", id, ch.To, ErrNoTransition)
	}
	var next any
	if len(ch.NextAction) > 0 {
		next = string(ch.NextAction)
	}
	return `
		UPDATE orders SET status = ?,
		    payment_intent_id = COALESCE(NULLIF(?, ''), payment_intent_id),
		    payment_status = COALESCE(NULLIF(?, ''), payment_status),
		    payment_next_action = CASE WHEN ? = 'requires_action' THEN ?::jsonb ELSE payment_next_action END,
		    payment_client_secret = CASE WHEN ? = 'requires_action' THEN NULLIF(?, '') ELSE payment_client_secret END,
		    payment_failure_code = NULLIF(?, ''),
		    payment_decline_code = NULLIF(?, ''),
		    requires_action_at = CASE WHEN ? = 'requires_action' THEN ? ELSE requires_action_at END,
		    payment_unknown_since = CASE WHEN ? = 'payment_unknown' THEN payment_unknown_since ELSE NULL END,
		    updated_at = ?
		WHERE id = ? AND status = ANY(?::text[])`,
		[]any{string(ch.To), ch.PaymentIntentID, string(ch.PaymentStatus),
			string(ch.To), next, string(ch.To), ch.ClientSecret,
			ch.FailureCode, ch.DeclineCode,
			string(ch.To), now, string(ch.To), now, id, postgres.TextArray(texts(from))}, nil
}

// texts returns ss as strings, for a query's IN list.
func texts(ss []Status) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}
