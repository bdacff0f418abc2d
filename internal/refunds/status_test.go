package refunds

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// contract is CONTRACT.md's refund lifecycle ("Refunds"), written out pair
// by pair: the transitions table must allow these and nothing else.
var contract = map[[2]Status]bool{
	{StatusPending, StatusSucceeded}: true,
	{StatusPending, StatusFailed}:    true,
	// Not at Stripe after RetryAfter: parked, never resent.
	{StatusPending, StatusRequiresAttention}: true,
	// Found at Stripe at last: moved as Stripe says.
	{StatusRequiresAttention, StatusPending}:   true,
	{StatusRequiresAttention, StatusSucceeded}: true,
	{StatusRequiresAttention, StatusFailed}:    true,
	// Stripe fails a refund after it succeeded
	// (https://docs.stripe.com/refunds#failed-refunds).
	{StatusSucceeded, StatusFailed}: true,
}

func TestRefundStatusesAreTheContracts(t *testing.T) {
	t.Parallel()
	require.Equal(t, []Status{"pending", "requires_attention", "succeeded", "failed"}, Statuses())
	var open []Status
	for _, from := range Statuses() {
		require.True(t, from.Valid())
		if from.Open() {
			open = append(open, from)
		}
		for _, to := range Statuses() {
			require.Equal(t, contract[[2]Status{from, to}], from.CanMoveTo(to), "%s -> %s", from, to)
		}
	}
	require.Equal(t, []Status{StatusPending, StatusRequiresAttention}, open)
	require.False(t, Status("canceled").Valid(), "Stripe's canceled is our failed")
}

// TestMoveEveryPair moves a refund from every status to every status,
// against PostgreSQL: the contract's pairs move the row (with the columns
// given), every other pair leaves it as it was.
func TestMoveEveryPair(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	for _, from := range Statuses() {
		for _, to := range Statuses() {
			t.Run(string(from)+"->"+string(to), func(t *testing.T) {
				id := newRefund(t, db, from)
				before := loadRow(t, db, id)
				now := before.UpdatedAt.Add(time.Minute)
				var moved bool
				err := postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
					var err error
					moved, err = move(ctx, tx, id, to, map[string]any{"stripe_status": "seen"}, now)
					return err
				})
				after := loadRow(t, db, id)
				if !contract[[2]Status{from, to}] {
					if len(froms[to]) == 0 {
						require.ErrorIs(t, err, ErrNoTransition)
					} else {
						require.NoError(t, err)
					}
					require.False(t, moved)
					require.Equal(t, before, after, "refused: the row is as it was")
					return
				}
				require.NoError(t, err)
				require.True(t, moved)
				require.Equal(t, to, after.Status)
				require.Equal(t, "seen", *after.StripeStatus, "the move's columns come with it")
				require.True(t, now.Equal(after.UpdatedAt))
			})
		}
	}
}

// newRefund inserts a paid order and a refund of it in status from.
func newRefund(t testing.TB, db *gorm.DB, from Status) string {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	o := &orders.Order{ID: ids.New("ord"), Status: orders.PendingPayment, Email: "buyer@example.com", Currency: "usd",
		AmountTotal: 2500, Items: []orders.OrderItem{{SKU: "sku_tee", Quantity: 1, UnitAmount: 2500, Amount: 2500}},
		Payment: orders.Payment{Provider: "stripe"}, CreatedAt: now, TenantID: "acme", PaymentMethod: "pm_card_visa"}
	require.NoError(t, orders.Insert(ctx, db, o))
	r := &refundRow{ID: ids.New("rf"), OrderID: o.ID, TenantID: "acme", Amount: 1000, Currency: "usd",
		Status: from, PaymentIntentID: "pi_1", CreatedAt: now, UpdatedAt: now}
	require.NoError(t, db.Create(r).Error)
	return r.ID
}

func loadRow(t testing.TB, db *gorm.DB, id string) refundRow {
	t.Helper()
	r, err := loadRefund(context.Background(), db, id, false)
	require.NoError(t, err)
	r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
	return *r
}
