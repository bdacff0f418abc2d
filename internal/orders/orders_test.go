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
	require.NoError(t, db.WithContext(ctx).Exec(`WITH o AS (`+orders.InsertSQL+` RETURNING id), i AS (`+orders.InsertItemsSQL+`) SELECT 1`,
		orders.InsertArgs(o)...).Error)
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

	// The one-statement form cannot see whether the PaymentIntent is
	// closed: it takes no exit at all.
	for _, to := range []orders.Status{orders.PaymentFailed, orders.Canceled} {
		_, _, err := orders.Statement(ids.New("ord"), orders.Change{To: to, PaymentStatus: "canceled"}, time.Now())
		require.ErrorIs(t, err, orders.ErrPaymentOpen, "Statement to %s", to)
	}
	_, _, err = orders.Statement(ids.New("ord"), orders.Change{To: orders.Paid}, time.Now())
	require.NoError(t, err)
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
