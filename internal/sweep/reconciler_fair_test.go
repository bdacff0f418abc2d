package sweep

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// stuckStripe is an OrderReconciler whose Stripe never answers for the
// orders it was told are stuck, and settles any other order it is asked
// about (paid); it counts how often each order was asked about.
type stuckStripe struct {
	db    *gorm.DB
	mu    sync.Mutex
	asked map[string]int
}

func (s *stuckStripe) ReconcileOrder(ctx context.Context, _, id string) (bool, error) {
	s.mu.Lock()
	s.asked[id]++
	s.mu.Unlock()
	if id != "ord_settles" {
		return false, errors.New("stripe: 503")
	}
	return true, s.db.WithContext(ctx).Exec(`UPDATE orders SET status = 'paid', updated_at = now() WHERE id = ?`, id).Error
}

func (s *stuckStripe) Complete(context.Context, int64) (bool, error) { return false, nil }

func (s *stuckStripe) SweepOrphans(context.Context, string, string) (int, error) { return 0, nil }

// TestReconcilerPagesAreFair (issue 35, defect 6): 150 orders in
// requires_action whose reconciliation keeps failing (Stripe unanswered),
// all older than one that can settle, with pages of 100: the one that can
// settle is polled, and settles, within ceil(151/100) = 2 rounds, and
// every stuck order is still polled (once per walk through them). Before,
// every round polled the same 100 oldest orders and the 151st never.
func TestReconcilerPagesAreFair(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now().UTC()
	require.NoError(t, db.Exec(`
		INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method,
		  payment_intent_id, payment_status, created_at, updated_at)
		SELECT CASE WHEN g = 151 THEN 'ord_settles' ELSE 'ord_stuck_' || g END, 'acme', 'requires_action',
		  'buyer@example.com', 'usd', 2500, 'pm_card_visa', 'pi_' || g, 'requires_action',
		  ?::timestamptz - interval '1 hour', ?::timestamptz - interval '1 hour' + g * interval '1 second'
		FROM generate_series(1, 151) g`, now, now).Error)

	svc := &stuckStripe{db: db, asked: map[string]int{}}
	r, err := NewReconciler(db, svc, ReconcilerConfig{BatchSize: 100, Now: func() time.Time { return now }})
	require.NoError(t, err)
	rounds := 0
	for ; rounds < 5 && svc.asked["ord_settles"] == 0; rounds++ {
		_, err := r.RunOnce(context.Background())
		require.NoError(t, err)
	}
	require.Equal(t, 1, svc.asked["ord_settles"], "the order that can settle was polled")
	require.Equal(t, 2, rounds, "within ceil(151/100) rounds")
	n, err := orders.Count(context.Background(), db, orders.Paid)
	require.NoError(t, err)
	require.EqualValues(t, 1, n[orders.Paid])
	for i := 1; i <= 150; i++ {
		require.Equal(t, 1, svc.asked["ord_stuck_"+strconv.Itoa(i)], "each stuck order polled once per walk")
	}

	// The walk starts over: the next round polls the oldest stuck ones again.
	_, err = r.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, svc.asked["ord_stuck_1"])
	require.Equal(t, 1, svc.asked["ord_stuck_150"])
}
