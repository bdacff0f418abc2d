package sweep

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestSweepReadsOnlyRecreatedOrders: the orphan sweep's query reads the
// orders that made a second create attempt, not the shop's history. Among
// 20,000 paid orders, each paid by its first create, and two with a
// second create (one swept 30 seconds ago, one not yet), it lists only the
// one not yet swept, and reads a few dozen buffers where the orders table
// alone has hundreds of pages (the query before migration 00007 read them
// all, every round).
func TestSweepReadsOnlyRecreatedOrders(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now().UTC()
	require.NoError(t, db.Exec(`
		INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method,
		  payment_intent_id, payment_status, payment_orphans_checked_at, created_at, updated_at)
		SELECT 'ord_' || g, 'acme', 'paid', 'buyer@example.com', 'usd', 2500, 'pm_card_visa',
		  'pi_' || g, 'succeeded', CASE WHEN g = 2 THEN ?::timestamptz - interval '30 seconds' END, ?, ?
		FROM generate_series(1, 20000) g`, now, now, now).Error)
	require.NoError(t, db.Exec(`
		INSERT INTO payment_attempts (order_id, tenant_id, step, attempt, idempotency_key, request_params,
		  outcome, created_at, updated_at)
		SELECT 'ord_' || g, 'acme', s.step, s.n, 'ord_' || g || '/' || s.step || '/' || s.n, '{}',
		  CASE WHEN s.step = 'create' AND s.n = 1 AND g <= 2 THEN 'indeterminate' ELSE 'succeeded' END, ?, ?
		FROM generate_series(1, 20000) g,
		  LATERAL (VALUES ('create', 1), ('confirm', 1), ('create', 2)) AS s (step, n)
		WHERE s.n = 1 OR g <= 2`, now, now).Error)
	require.NoError(t, db.Exec(`ANALYZE`).Error)

	args := []any{now.Add(-72 * time.Hour), now.Add(-time.Minute), 100}
	var got []struct{ TenantID, ID string }
	require.NoError(t, db.Raw(sweepCandidates, args...).Scan(&got).Error)
	require.Equal(t, []struct{ TenantID, ID string }{{"acme", "ord_1"}}, got,
		"only the recreated order not swept within SweepEvery")

	var plan []byte
	require.NoError(t, db.Raw(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+sweepCandidates, args...).Row().Scan(&plan))
	var explained []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		}
	}
	require.NoError(t, json.Unmarshal(plan, &explained))
	var ordersPages int
	require.NoError(t, db.Raw(`SELECT pg_relation_size('orders') / current_setting('block_size')::int`).Row().Scan(&ordersPages))
	require.Greater(t, ordersPages, 300)
	require.Less(t, explained[0].Plan.Hit+explained[0].Plan.Read, 50, "buffers read by the sweep's query: %s", plan)
}
