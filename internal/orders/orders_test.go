package orders_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// contract is CONTRACT.md's lifecycle, written out pair by pair: the
// transitions table must allow these and nothing else.
var contract = map[[2]orders.Status]bool{
	{orders.PendingPayment, orders.RequiresAction}: true,
	{orders.PendingPayment, orders.PaymentUnknown}: true,
	{orders.PendingPayment, orders.Paid}:           true,
	{orders.PendingPayment, orders.PaymentFailed}:  true,
	// A payment found unknown may still turn out to need the customer.
	{orders.PaymentUnknown, orders.RequiresAction}: true,
	{orders.PaymentUnknown, orders.Paid}:           true,
	{orders.PaymentUnknown, orders.PaymentFailed}:  true,
	{orders.RequiresAction, orders.Paid}:           true,
	{orders.RequiresAction, orders.PaymentFailed}:  true,
	{orders.RequiresAction, orders.Canceled}:       true,
	{orders.Paid, orders.PartiallyRefunded}:        true,
	{orders.Paid, orders.Refunded}:                 true,
	{orders.PartiallyRefunded, orders.Refunded}:    true,
}

func TestStatusesAreTheContracts(t *testing.T) {
	t.Parallel()
	want := []orders.Status{"pending_payment", "payment_unknown", "requires_action", "paid", "payment_failed",
		"canceled", "partially_refunded", "refunded"}
	require.Equal(t, want, orders.All())
	for _, from := range orders.All() {
		for _, to := range orders.All() {
			require.Equal(t, contract[[2]orders.Status{from, to}], from.CanMoveTo(to), "%s -> %s", from, to)
		}
	}
	require.ElementsMatch(t, []orders.Status{orders.PendingPayment, orders.PaymentUnknown, orders.RequiresAction}, orders.Waiting())
	require.ElementsMatch(t, []orders.Status{orders.PendingPayment, orders.PaymentUnknown}, orders.Pending())
	var exits, paidOnce, terminal, refundable []orders.Status
	for _, s := range orders.All() {
		if s.LeavesTheWayToPaid() {
			exits = append(exits, s)
		}
		if s.PaidOnce() {
			paidOnce = append(paidOnce, s)
		}
		if s.Terminal() {
			terminal = append(terminal, s)
		}
		if s.Refundable() {
			refundable = append(refundable, s)
		}
	}
	require.Equal(t, []orders.Status{orders.PaymentFailed, orders.Canceled}, exits)
	require.Equal(t, []orders.Status{orders.Paid, orders.PartiallyRefunded, orders.Refunded}, paidOnce)
	require.Equal(t, []orders.Status{orders.PaymentFailed, orders.Canceled, orders.Refunded}, terminal)
	require.Equal(t, []orders.Status{orders.Paid, orders.PartiallyRefunded}, refundable)
	require.False(t, orders.Status("shipped").Valid())
}

// newOrder inserts an order of one sku_tee in status from and returns it.
func newOrder(t testing.TB, db *gorm.DB, from orders.Status, piID string) *orders.Order {
	t.Helper()
	ctx := context.Background()
	created := time.Now().UTC().Truncate(time.Microsecond).Add(-time.Hour)
	o := &orders.Order{ID: ids.New("ord"), Status: orders.PendingPayment, Email: "buyer@example.com", Currency: "usd",
		AmountTotal: 2500, Items: []orders.OrderItem{{SKU: "sku_tee", Quantity: 1, UnitAmount: 2500, Amount: 2500}},
		Payment: orders.Payment{Provider: "stripe"}, CreatedAt: created, TenantID: "acme", PaymentMethod: "pm_card_visa"}
	require.NoError(t, orders.Insert(ctx, db, o))
	if piID != "" {
		_, err := orders.RecordIntent(ctx, db, o.ID, piID, "requires_confirmation", created)
		require.NoError(t, err)
	}
	// Put it in from directly: the test needs every status as a start.
	require.NoError(t, db.Exec(`UPDATE orders SET status = ? WHERE id = ?`, string(from), o.ID).Error)
	got, err := orders.Load(ctx, db, "acme", o.ID)
	require.NoError(t, err)
	return got
}

type snapshot struct {
	Status, UpdatedAt string
	Events            int64
}

func snap(t testing.TB, db *gorm.DB, id string) snapshot {
	t.Helper()
	var s snapshot
	require.NoError(t, db.Raw(`SELECT status, updated_at::text AS updated_at,
		(SELECT count(*) FROM outbox WHERE aggregate_id = o.id) AS events
		FROM orders o WHERE id = ?`, id).Scan(&s).Error)
	return s
}

// TestApplyEveryPair applies a change to every status from every status,
// against PostgreSQL: the contract's pairs move the order (and add the
// status's event), every other pair leaves the row as it was.
func TestApplyEveryPair(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	for _, from := range orders.All() {
		for _, to := range orders.All() {
			t.Run(string(from)+"->"+string(to), func(t *testing.T) {
				o := newOrder(t, db, from, "")
				before := snap(t, db, o.ID)
				now := time.Now().UTC().Truncate(time.Microsecond)
				ch := orders.Change{To: to, Closed: true}
				if to.LeavesTheWayToPaid() {
					ch.FailureCode = "payment_canceled"
				}
				var after *orders.Order
				err := postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
					var err error
					after, err = orders.Apply(ctx, tx, o.ID, ch, now)
					return err
				})
				got := snap(t, db, o.ID)
				if !contract[[2]orders.Status{from, to}] {
					if to == orders.PendingPayment {
						require.ErrorIs(t, err, orders.ErrNoTransition)
					} else {
						require.NoError(t, err)
					}
					require.Nil(t, after, "refused: nothing to return")
					require.Equal(t, before, got, "refused: the row is as it was")
					return
				}
				require.NoError(t, err)
				require.NotNil(t, after)
				require.Equal(t, to, after.Status)
				require.Equal(t, o.Items, after.Items)
				require.Equal(t, string(to), got.Status)
				wantEvents := before.Events
				if to.Event() != "" {
					wantEvents++
					var typ string
					require.NoError(t, db.Raw(`SELECT type FROM outbox WHERE aggregate_id = ? ORDER BY seq DESC LIMIT 1`, o.ID).Scan(&typ).Error)
					require.Equal(t, to.Event(), typ)
				}
				require.Equal(t, wantEvents, got.Events)
			})
		}
	}
}

// TestApplyRefusesAnOpenExit: an order whose PaymentIntent is not closed
// cannot leave the way to paid.
func TestApplyRefusesAnOpenExit(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	for _, to := range []orders.Status{orders.PaymentFailed, orders.Canceled} {
		o := newOrder(t, db, orders.RequiresAction, "pi_open")
		before := snap(t, db, o.ID)
		_, err := orders.Apply(ctx, db, o.ID, orders.Change{To: to, FailureCode: "card_declined"}, time.Now())
		require.ErrorIs(t, err, orders.ErrPaymentOpen)
		require.Equal(t, before, snap(t, db, o.ID))

		after, err := orders.Apply(ctx, db, o.ID, orders.Change{To: to, PaymentStatus: "canceled"}, time.Now())
		require.NoError(t, err)
		require.Equal(t, to, after.Status)
	}
	_, err := orders.Apply(ctx, db, ids.New("ord"), orders.Change{To: orders.PaymentFailed}, time.Now())
	require.True(t, errors.Is(err, orders.ErrNotFound), "%v", err)

	// The batch form cannot read whether the order has a PaymentIntent:
	// it takes an exit only when the change itself says the PaymentIntent
	// is closed, and queues nothing otherwise.
	for _, to := range []orders.Status{orders.PaymentFailed, orders.Canceled} {
		var b postgres.Batch
		_, err := orders.QueueApply(t.Context(), &b, &orders.Order{ID: ids.New("ord")}, orders.Change{To: to, FailureCode: "card_declined"}, time.Now())
		require.ErrorIs(t, err, orders.ErrPaymentOpen, "QueueApply to %s", to)
		require.Zero(t, b.Len())
		for _, closed := range []orders.Change{{To: to, PaymentStatus: "canceled"}, {To: to, Closed: true}} {
			var b postgres.Batch
			_, err := orders.QueueApply(t.Context(), &b, &orders.Order{ID: ids.New("ord")}, closed, time.Now())
			require.NoError(t, err, "QueueApply to %s of a closed PaymentIntent", to)
			require.NotZero(t, b.Len())
		}
	}
}

// TestQueueApply: in a batch, a change writes the status and its event and
// returns the order as Load reads it back; an order that moved fails the
// batch at GuardMoved, which writes nothing of it.
func TestQueueApply(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	o := newOrder(t, db, orders.PendingPayment, "pi_1")
	now := time.Now().UTC().Truncate(time.Microsecond)

	var b postgres.Batch
	paid, err := orders.QueueApply(t.Context(), &b, o, orders.Change{To: orders.Paid, PaymentIntentID: "pi_1", PaymentStatus: "succeeded"}, now)
	require.NoError(t, err)
	require.NoError(t, postgres.Send(ctx, db, &b))
	got, err := orders.Load(ctx, db, "acme", o.ID)
	require.NoError(t, err)
	require.Equal(t, got, paid, "Changed is what Load reads back")
	require.Equal(t, orders.Paid, got.Status)
	var events []string
	require.NoError(t, db.Raw(`SELECT type FROM outbox WHERE aggregate_id = ? ORDER BY aggregate_seq`, o.ID).Scan(&events).Error)
	require.Equal(t, []string{"order.paid"}, events)

	// Paid again: it moved; the statement queued before it is undone too.
	var again postgres.Batch
	again.Queue(`UPDATE orders SET email = 'x@example.com' WHERE id = ?`, []any{o.ID}, nil)
	_, err = orders.QueueApply(t.Context(), &again, o, orders.Change{To: orders.RequiresAction, PaymentStatus: "requires_action"}, now)
	require.NoError(t, err)
	require.True(t, postgres.IsGuard(postgres.Send(ctx, db, &again), orders.GuardMoved))
	after, err := orders.Load(ctx, db, "acme", o.ID)
	require.NoError(t, err)
	require.Equal(t, got, after)
	require.NoError(t, db.Raw(`SELECT type FROM outbox WHERE aggregate_id = ? ORDER BY aggregate_seq`, o.ID).Scan(&events).Error)
	require.Equal(t, []string{"order.paid"}, events)

	// requires_action shows Stripe's next action, as Load does.
	pending := newOrder(t, db, orders.PendingPayment, "pi_2")
	var ra postgres.Batch
	next, err := orders.QueueApply(t.Context(), &ra, pending, orders.Change{To: orders.RequiresAction, PaymentStatus: "requires_action",
		NextAction: []byte(`{"type":"redirect_to_url"}`), ClientSecret: "pi_2_secret"}, now)
	require.NoError(t, err)
	require.NoError(t, postgres.Send(ctx, db, &ra))
	got, err = orders.Load(ctx, db, "acme", pending.ID)
	require.NoError(t, err)
	require.JSONEq(t, string(next.Payment.NextAction), string(got.Payment.NextAction))
	got.Payment.NextAction = next.Payment.NextAction // jsonb's spacing is its own
	require.Equal(t, got, next)
}

// TestQueueRecordIntent: the first PaymentIntent recorded wins; another
// fails the batch at GuardIntentTaken.
func TestQueueRecordIntent(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	o := newOrder(t, db, orders.PendingPayment, "")
	now := time.Now()
	var b postgres.Batch
	orders.QueueRecordIntent(&b, o.ID, "pi_1", "requires_confirmation", now)
	orders.QueueRecordIntent(&b, o.ID, "pi_1", "requires_confirmation", now) // the same again: a no-op
	require.NoError(t, postgres.Send(ctx, db, &b))
	var other postgres.Batch
	orders.QueueRecordIntent(&other, o.ID, "pi_2", "requires_confirmation", now)
	require.True(t, postgres.IsGuard(postgres.Send(ctx, db, &other), orders.GuardIntentTaken))
	got, err := orders.Load(ctx, db, "acme", o.ID)
	require.NoError(t, err)
	require.Equal(t, "pi_1", got.Payment.PaymentIntentID)
}

// TestSettleRefund moves a paid order to partially_refunded, then
// refunded, and never back.
func TestSettleRefund(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	o := newOrder(t, db, orders.Paid, "pi_paid")
	step := func(reserved, refunded int64) *orders.Balance {
		t.Helper()
		var b *orders.Balance
		require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
			if _, err := orders.LockBalance(ctx, tx, "acme", o.ID); err != nil {
				return err
			}
			if err := orders.SettleRefund(ctx, tx, o.ID, reserved, refunded, time.Now()); err != nil {
				return err
			}
			var err error
			b, err = orders.LockBalance(ctx, tx, "", o.ID)
			return err
		}))
		return b
	}
	require.NoError(t, orders.Reserve(ctx, db, o.ID, 1000, time.Now()))
	b := step(0, 1000)
	require.Equal(t, orders.PartiallyRefunded, b.Status)
	require.Equal(t, int64(1000), b.AmountRefunded)
	require.NoError(t, orders.Reserve(ctx, db, o.ID, 500, time.Now()))
	b = step(0, 500)
	require.Equal(t, orders.PartiallyRefunded, b.Status, "another partial refund keeps the status")
	b = step(-500, -500)
	require.Equal(t, orders.PartiallyRefunded, b.Status, "a failure moves nothing back")
	require.Equal(t, int64(1000), b.RefundReserved)
	require.NoError(t, orders.Reserve(ctx, db, o.ID, 1500, time.Now()))
	b = step(0, 1500)
	require.Equal(t, orders.Refunded, b.Status)
	_, err := orders.LockBalance(ctx, db, "globex", o.ID)
	require.ErrorIs(t, err, orders.ErrNotFound)
}
