package sweep

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestOrphanSweepsReadOnlyRecreatedOrders: among 20,000 paid orders, each
// paid by its first create, and two with a second create (one swept 30
// seconds ago, one not yet), the round's orphan sweep lists only the one
// not yet swept. (How little of the table it reads is pinned by
// stripestep's TestRecreatedReadsItsIndex.)
func TestOrphanSweepsReadOnlyRecreatedOrders(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now().UTC()
	require.NoError(t, db.Exec(`
		INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method,
		  payment_intent_id, payment_status, payment_orphans_checked_at, created_at, updated_at)
		SELECT 'ord_' || g, 'acme', CASE WHEN g = 3 THEN 'pending_payment' ELSE 'paid' END,
		  'buyer@example.com', 'usd', 2500, 'pm_card_visa',
		  'pi_' || g, 'succeeded', CASE WHEN g = 2 THEN ?::timestamptz - interval '30 seconds' END, ?, ?
		FROM generate_series(1, 20000) g`, now, now, now).Error)
	require.NoError(t, db.Exec(`
		INSERT INTO payment_attempts (order_id, tenant_id, step, attempt, idempotency_key, request_params,
		  outcome, created_at, updated_at)
		SELECT 'ord_' || g, 'acme', s.step, s.n, 'ord_' || g || '/' || s.step || '/' || s.n, '{}',
		  CASE WHEN s.step = 'create' AND s.n = 1 AND g <= 3 THEN 'indeterminate' ELSE 'succeeded' END, ?, ?
		FROM generate_series(1, 20000) g,
		  LATERAL (VALUES ('create', 1), ('confirm', 1), ('create', 2)) AS s (step, n)
		WHERE s.n = 1 OR g <= 3`, now, now).Error)

	r, err := NewReconciler(db, nil, ReconcilerConfig{SweepEvery: time.Minute, Now: func() time.Time { return now }})
	require.NoError(t, err)
	got, err := r.orphanSweeps(context.Background(), now)
	require.NoError(t, err)
	require.Equal(t, []orders.Ref{{TenantID: "acme", ID: "ord_1"}}, got,
		"only the settled recreated order not swept within SweepEvery (ord_3 is still being paid)")
}

// TestUnknownPaymentsPageThroughTheCompletersKeys: the keys the reconciler
// passes over (expired, but their payment is not in doubt: the
// completer's) never hide the ones behind them. With a batch of 2 and five
// such keys expired first, it still finds the key of an order in
// payment_unknown and the key of an order whose latest attempt is
// indeterminate, and none of a finished key, a key whose lease expired
// within Grace, an order that is paid, or an indeterminate create followed
// by a confirm that succeeded.
func TestUnknownPaymentsPageThroughTheCompletersKeys(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	type key struct {
		order, status, point string
		expired              time.Duration // how long before now its lease ended
		outcomes             []string      // create then confirm, the latest last
	}
	keys := []key{
		{"ord_c1", "pending_payment", "order_created", 10 * time.Minute, []string{"succeeded"}},
		{"ord_c2", "pending_payment", "order_created", 9 * time.Minute, nil},
		{"ord_c3", "pending_payment", "payment_started", 9 * time.Minute, []string{"succeeded", ""}},
		{"ord_c4", "requires_action", "order_created", 9 * time.Minute, []string{"succeeded", "succeeded"}},
		{"ord_c5", "pending_payment", "order_created", 8 * time.Minute, []string{"indeterminate", "succeeded"}},
		{"ord_unknown", "payment_unknown", "order_created", 7 * time.Minute, []string{"succeeded", ""}},
		{"ord_paid", "paid", "order_created", 7 * time.Minute, []string{"indeterminate"}},
		{"ord_done", "pending_payment", "finished", 7 * time.Minute, []string{"indeterminate"}},
		{"ord_fresh", "pending_payment", "order_created", time.Second, []string{"indeterminate"}},
		{"ord_indet", "pending_payment", "order_created", 6 * time.Minute, []string{"succeeded", "indeterminate"}},
	}
	want := map[int64]string{}
	for i, k := range keys {
		require.NoError(t, db.Exec(`
			INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
			VALUES (?, 'acme', ?, 'buyer@example.com', 'usd', 2500, 'pm_card_visa', ?, ?)`,
			k.order, k.status, now, now).Error)
		var id int64
		require.NoError(t, db.Raw(`
			INSERT INTO idempotency_keys (tenant_id, route, key, fingerprint, recovery_point, order_id,
			  lease_owner, lease_expires_at, created_at, updated_at, expires_at)
			VALUES ('acme', 'POST /v1/checkout', ?, 'f', ?, ?, 'gone', ?, ?, ?, ?) RETURNING id`,
			k.order, k.point, k.order, now.Add(-k.expired), now, now, now.Add(time.Hour)).Scan(&id).Error)
		for j, outcome := range k.outcomes {
			step := []string{"create", "confirm"}[j]
			// The later step is the later write: updated_at orders them.
			at := now.Add(-time.Hour + time.Duration(i*10+j)*time.Second)
			require.NoError(t, db.Exec(`
				INSERT INTO payment_attempts (order_id, tenant_id, step, attempt, idempotency_key, request_params,
				  outcome, created_at, updated_at)
				VALUES (?, 'acme', ?, 1, ? || '/' || ? || '/1', '{}', NULLIF(?, ''), ?, ?)`,
				k.order, step, k.order, step, outcome, at, at).Error)
		}
		if k.order == "ord_unknown" || k.order == "ord_indet" {
			want[id] = k.order
		}
	}

	r, err := NewReconciler(db, nil, ReconcilerConfig{BatchSize: 2, Grace: time.Minute, Now: func() time.Time { return now }})
	require.NoError(t, err)
	got, err := r.unknownPayments(context.Background(), now)
	require.NoError(t, err)
	require.Len(t, got, 2, "found %v", got)
	for _, id := range got {
		require.Contains(t, want, id)
	}
}
