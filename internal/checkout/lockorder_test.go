package checkout

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/ids"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/stripeintent"
)

// TestSettleLocksTheKeyBeforeTheOrder: the settlement of an outcome (phase
// 3) locks the key before the order, the one lock order of every keyed
// transaction (idempotency.Fence). Another transaction holds the key
// locked, as a takeover of it does before it writes the order; the run's
// settlement must then wait for the key without holding the order. The
// holder checks that by locking the order without waiting (NOWAIT): a
// settlement that locked the order first would make the two deadlock in
// production, and fails that lock here. Once the holder lets go, the run
// settles: the order paid once, the key finished with the 201, one
// order.paid.
func TestSettleLocksTheKeyBeforeTheOrder(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	keys := &idempotency.Store{Lease: time.Minute, TTL: time.Hour, Now: time.Now}
	s := &Service{DB: db, Keys: keys, Logger: slog.New(slog.DiscardHandler), Now: time.Now}

	o := s.newOrder("acme", &Request{Email: "buyer@example.com", PaymentMethod: "pm_card_visa",
		Items: []RequestItem{{SKU: "sku_tee", Quantity: 1}}},
		map[string]Product{"sku_tee": {SKU: "sku_tee", UnitAmount: 2500, Currency: "usd"}})
	require.NoError(t, orders.Insert(ctx, db, o))
	_, err := orders.RecordIntent(ctx, db, o.ID, "pi_lock", stripeintent.RequiresConfirmation, o.CreatedAt)
	require.NoError(t, err)
	o.Payment.PaymentIntentID, o.Payment.Status = "pi_lock", stripeintent.RequiresConfirmation
	scope := idempotency.Scope{Tenant: "acme", Route: Route, Key: ids.New("key")}
	claim, err := keys.Claim(ctx, db, scope, "fingerprint", "owner-1")
	require.NoError(t, err)
	require.NoError(t, keys.Advance(ctx, db, claim, RecoveryPointOrderCreated, o.ID))

	// The holder: the key locked, as a takeover's first statement locks it.
	holder := db.Begin()
	t.Cleanup(func() { holder.Rollback() })
	var holderPID int
	require.NoError(t, holder.Raw(`SELECT pg_backend_pid()`).Row().Scan(&holderPID))
	require.NoError(t, holder.Exec(`SELECT id FROM idempotency_keys WHERE id = ? FOR UPDATE`, claim.ID).Error)

	type result struct {
		resp *idempotency.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := s.newRun(claim, Route, o).settle(ctx, &verdict{pi: &PaymentIntentState{ID: "pi_lock", Status: stripeintent.Succeeded}})
		done <- result{resp, err}
	}()
	waitBlockedBy(t, db, holderPID, done)

	// The run waits for the key; the order must still be free.
	err = holder.Exec(`SELECT id FROM orders WHERE id = ? FOR UPDATE NOWAIT`, o.ID).Error
	require.NoError(t, err, "the settlement locked the order before the key")
	require.NoError(t, holder.Commit().Error)

	res := <-done
	require.NoError(t, res.err)
	require.NotNil(t, res.resp)
	require.Equal(t, 201, res.resp.Status)
	cur, err := orders.Load(ctx, db, "acme", o.ID)
	require.NoError(t, err)
	require.Equal(t, orders.Paid, cur.Status)
	var paidEvents int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = ?`,
		o.ID, outbox.TypeOrderPaid).Row().Scan(&paidEvents))
	require.Equal(t, int64(1), paidEvents, "order.paid events")
	var point string
	require.NoError(t, db.Raw(`SELECT recovery_point FROM idempotency_keys WHERE id = ?`, claim.ID).Row().Scan(&point))
	require.Equal(t, idempotency.RecoveryPointFinished, point)
}

// waitBlockedBy returns once a backend of db's database waits for a lock
// held by the backend holderPID. It fails the test when the run reports on
// done first: it did not wait for the holder at all.
func waitBlockedBy[T any](t *testing.T, db *gorm.DB, holderPID int, done <-chan T) {
	t.Helper()
	for {
		var n int64
		require.NoError(t, db.Raw(`SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND ? = ANY(pg_blocking_pids(pid))`, holderPID).Row().Scan(&n))
		if n > 0 {
			return
		}
		select {
		case r := <-done:
			t.Fatalf("the run ended without waiting for the key's holder: %+v", r)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
