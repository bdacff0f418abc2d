package stripestep

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestRecreatedReadsItsIndex: the orphan sweep's question to the step log
// reads the attempts that can leave an orphan, not the shop's history.
// Among the attempts of 20,000 orders paid by their first create, and two
// orders with a second create (one of them written before since), it
// returns the one, and reads a few dozen buffers where payment_attempts
// alone has hundreds of pages (the sweep before migration 00007 read them
// all, every round).
func TestRecreatedReadsItsIndex(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now().UTC()
	insertPaidOrders(t, db, now)
	require.NoError(t, db.Exec(`
		INSERT INTO payment_attempts (order_id, tenant_id, step, attempt, idempotency_key, request_params,
		  outcome, created_at, updated_at)
		SELECT 'ord_' || g, 'acme', s.step, s.n, 'ord_' || g || '/' || s.step || '/' || s.n, '{}',
		  'succeeded', CASE WHEN g = 2 THEN ?::timestamptz - interval '73 hours' ELSE ? END, ?
		FROM generate_series(1, 20000) g,
		  LATERAL (VALUES ('create', 1), ('confirm', 1), ('create', 2)) AS s (step, n)
		WHERE s.n = 1 OR g <= 2`, now, now, now).Error)
	require.NoError(t, db.Exec(`ANALYZE`).Error)

	since := now.Add(-72 * time.Hour)
	got, err := Recreated(context.Background(), db, since)
	require.NoError(t, err)
	require.Equal(t, []string{"ord_1"}, got)

	var plan []byte
	require.NoError(t, db.Raw(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+recreatedSQL, since).Row().Scan(&plan))
	var explained []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		}
	}
	require.NoError(t, json.Unmarshal(plan, &explained))
	var pages int
	require.NoError(t, db.Raw(`SELECT pg_relation_size('payment_attempts') / current_setting('block_size')::int`).Row().Scan(&pages))
	require.Greater(t, pages, 300)
	require.Less(t, explained[0].Plan.Hit+explained[0].Plan.Read, 50, "buffers read by the query: %s", plan)
}

// TestStrayRefundsReadItsIndex: among 20,000 orders' create and confirm
// attempts, StrayRefunds returns the latest attempt of each stray refund
// step (two orders, one of them on its second attempt) and reads the
// partial index payment_attempts_stray_refunds (migration 00019), a few
// buffers, not the table the reconciler would otherwise scan every round.
func TestStrayRefundsReadItsIndex(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now().UTC()
	insertPaidOrders(t, db, now)
	require.NoError(t, db.Exec(`
		INSERT INTO payment_attempts (order_id, tenant_id, step, attempt, idempotency_key, request_params,
		  outcome, created_at, updated_at)
		SELECT 'ord_' || g, 'acme', s.step, s.n, 'ord_' || g || '/' || s.step || '/' || s.n, '{}', 'succeeded', ?, ?
		FROM generate_series(1, 20000) g,
		  LATERAL (VALUES ('create', 1), ('confirm', 1), ('stray-refund:pi_x', 1), ('stray-refund:pi_x', 2)) AS s (step, n)
		WHERE s.step NOT LIKE 'stray%' OR g = 1 OR (g = 2 AND s.n = 1)`, now, now).Error)
	require.NoError(t, db.Exec(`ANALYZE`).Error)

	got, err := StrayRefunds(context.Background(), db)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, "ord_1", got[0].OrderID)
	require.Equal(t, 2, got[0].Attempt, "the latest attempt")
	require.Equal(t, "ord_2", got[1].OrderID)
	require.Equal(t, 1, got[1].Attempt)

	var plan []byte
	require.NoError(t, db.Raw(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+straySQL).Row().Scan(&plan))
	var explained []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		}
	}
	require.NoError(t, json.Unmarshal(plan, &explained))
	require.Less(t, explained[0].Plan.Hit+explained[0].Plan.Read, 20, "buffers read by the query: %s", plan)
}

// insertPaidOrders inserts 20,000 paid orders, ord_1 to ord_20000, made
// at now: a shop's history for the sweeps' index tests.
func insertPaidOrders(t *testing.T, db *gorm.DB, now time.Time) {
	t.Helper()
	require.NoError(t, db.Exec(`
		INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		SELECT 'ord_' || g, 'acme', 'paid', 'buyer@example.com', 'usd', 2500, 'pm_card_visa', ?, ?
		FROM generate_series(1, 20000) g`, now, now).Error)
}
