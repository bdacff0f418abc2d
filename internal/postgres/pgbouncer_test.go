package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestPgBouncerTransactionPoolingNeedsUnnamedStatements: behind PgBouncer
// in transaction pooling (here 2 server connections for 16 clients), pgx's
// default exec mode fails: it prepares a named statement on one server
// connection and later executes it on another. With
// default_query_exec_mode=cache_describe (docs/operations.md, "PgBouncer") every
// statement is sent unnamed with its parse, and every query succeeds.
func TestPgBouncerTransactionPoolingNeedsUnnamedStatements(t *testing.T) {
	t.Parallel()
	_, direct := pgtest.NewDB(t)
	u, err := url.Parse(direct)
	require.NoError(t, err)
	bouncer, err := pgtest.StartPgBouncer(t, u.Host, pgtest.PgBouncerOptions{PoolSize: 2})
	require.NoError(t, err)
	via := func(params string) string {
		return fmt.Sprintf("postgres://postgres@%s%s?sslmode=disable%s", bouncer.Addr, u.Path, params)
	}

	// load runs the same few parameterized queries from 16 connections at
	// once, inside and outside transactions, and returns the errors seen.
	load := func(url string) []error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		db, err := postgres.Open(ctx, postgres.Config{URL: url, MaxConns: 16})
		require.NoError(t, err)
		defer postgres.Close(db)
		var (
			mu   sync.Mutex
			errs []error
			wg   sync.WaitGroup
		)
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 30 {
					var n int
					err := db.WithContext(ctx).Raw(`SELECT count(*) FROM product_catalog WHERE sku <> ? AND ? > 0`, fmt.Sprint(g), i+1).Scan(&n).Error
					if err == nil {
						err = postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
							return tx.Exec(`UPDATE stock_buckets SET stock = stock WHERE sku = ? AND bucket = ?`, "sku_tee", i%4).Error
						})
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		return errs
	}

	errs := load(via(""))
	require.NotEmpty(t, errs, "pgx's default exec mode behind transaction pooling")
	require.ErrorContains(t, errs[0], "prepared statement")
	require.Empty(t, load(via("&default_query_exec_mode=cache_describe")), "cache_describe behind transaction pooling")
}
