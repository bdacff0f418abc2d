package api_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

func teeQty(n int) string {
	return fmt.Sprintf(`{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":%d}],"payment_method":"pm_card_visa"}`, n)
}

// TestStockNeverOversoldUnderConcurrency races more buyers than there are
// units: stock is split into buckets taken with SKIP LOCKED, and still
// exactly the stock is sold, the rest get 409 out_of_stock, nothing is left
// and nothing goes below zero.
func TestStockNeverOversoldUnderConcurrency(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.maxConns = 40 })
	require.NoError(t, h.db.Exec(`UPDATE products SET stock = 20 WHERE sku = 'sku_tee'`).Error)
	require.EqualValues(t, 20, h.stock("sku_tee"))

	const buyers = 60
	replies := make([]reply, buyers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			replies[i] = h.checkout(fmt.Sprintf("race-%d", i), teeQty(1+i%2))
		}()
	}
	close(start)
	wg.Wait()

	sold := 0
	for _, r := range replies {
		switch r.status {
		case http.StatusCreated:
			var o struct{ Items []struct{ Quantity int } }
			require.NoError(t, json.Unmarshal(r.body, &o))
			sold += o.Items[0].Quantity
		case http.StatusConflict:
			require.Equal(t, "out_of_stock", decodeProblem(t, r).Code)
		default:
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	require.EqualValues(t, 20-sold, h.stock("sku_tee"), "what was sold left the stock, nothing else")
	require.LessOrEqual(t, sold, 20)
	require.GreaterOrEqual(t, sold, 19, "a buyer was refused while units were left: at most one unit can be left over when the last buyers ask for 2")
	require.Equal(t, sold, h.count(`SELECT coalesce(sum(quantity), 0) FROM order_items WHERE sku = 'sku_tee'`))
	require.Zero(t, h.count(`SELECT count(*) FROM stock_buckets WHERE stock < 0`))
}

// TestQuantityAboveAnyBucketIsTakenFromSeveral: the stock is exact, not per
// bucket: with one unit in each of 16 buckets, 5 can still be bought, and
// the last 11 at once.
func TestQuantityAboveAnyBucketIsTakenFromSeveral(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.NoError(t, h.db.Exec(`UPDATE products SET stock = 16 WHERE sku = 'sku_tee'`).Error)
	require.Equal(t, 16, h.count(`SELECT count(*) FROM stock_buckets WHERE sku = 'sku_tee' AND stock = 1`))

	require.Equal(t, http.StatusCreated, h.checkout("several-1", teeQty(5)).status)
	require.EqualValues(t, 11, h.stock("sku_tee"))
	r := h.checkout("several-2", teeQty(12))
	require.Equal(t, http.StatusConflict, r.status)
	require.Equal(t, "out_of_stock", decodeProblem(t, r).Code)
	require.EqualValues(t, 11, h.stock("sku_tee"), "a refused checkout takes nothing")
	require.Equal(t, http.StatusCreated, h.checkout("several-3", teeQty(11)).status)
	require.EqualValues(t, 0, h.stock("sku_tee"))

	p := h.get("sk_test_acme", "/v1/products")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, string(p.body), `"sku":"sku_tee","name":"T-shirt","unit_amount":2500,"currency":"usd","stock":0`)
}

// TestStockReservationsNeverDeadlock: reservations of 1 and 2 units racing
// for the last units of a hot SKU, each held for a moment before its
// commit, as a checkout's first statement holds them, never deadlock. A
// bucket locked by the fast path's FOR UPDATE SKIP LOCKED whose stock a
// concurrent commit had just lowered below the quantity used to stay locked
// after the fast path moved on, and the slow path then waited for the
// others while holding it. Each round restocks 2 units a bucket.
func TestStockReservationsNeverDeadlock(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.maxConns = 40 })
	deadline := time.Now().Add(4 * time.Second)
	var deadlocks, other atomic.Int64
	rounds := 0
	for ; time.Now().Before(deadline); rounds++ {
		require.NoError(t, h.db.Exec(`UPDATE products SET stock = 32 WHERE sku = 'sku_tee'`).Error)
		var reserved atomic.Int64 // units of the reservations that committed
		var wg sync.WaitGroup
		for i := range 24 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					var ok bool
					err := h.db.Transaction(func(tx *gorm.DB) error {
						if err := tx.Raw(`SELECT reserve_stock('{sku_tee}', ARRAY[?]::bigint[])`, 1+i%2).Scan(&ok).Error; err != nil {
							return err
						}
						return tx.Exec(`SELECT pg_sleep(0.002)`).Error
					})
					var pgErr *pgconn.PgError
					switch {
					case errors.As(err, &pgErr) && pgErr.Code == "40P01":
						deadlocks.Add(1)
					case err != nil:
						other.Add(1)
						return
					case !ok:
						return
					default:
						reserved.Add(int64(1 + i%2))
					}
				}
			}()
		}
		wg.Wait()
		require.Zero(t, h.count(`SELECT count(*) FROM stock_buckets WHERE stock < 0`))
		// The buyers of one unit stop only when none is left: every unit
		// went to exactly one committed reservation.
		require.EqualValues(t, 0, h.stock("sku_tee"), "round %d", rounds)
		require.EqualValues(t, 32, reserved.Load(), "round %d: units reserved", rounds)
	}
	require.Zero(t, other.Load(), "errors other than deadlocks")
	require.Zero(t, deadlocks.Load(), "deadlocks in %d rounds", rounds)
}
