package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/outbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

// TestSequenceFollowsCommitOrderPerAggregate: 20 transactions add an event
// of the same order at once; the sequence numbers are 1..20 without gaps or
// repeats, each body carries its number, and a rolled-back transaction
// leaves no hole. Another aggregate counts on its own.
func TestSequenceFollowsCommitOrderPerAggregate(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	add := func(tx *gorm.DB, agg string) error {
		return outbox.Add(ctx, tx, outbox.Event{Type: outbox.TypeOrderPaid, TenantID: "acme", AggregateID: agg, Data: map[string]any{"id": agg}})
	}
	require.Error(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error {
		require.NoError(t, add(tx, "ord_a"))
		return context.Canceled // rolled back: its number is not used
	}))
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, postgres.WithTx(ctx, db, func(tx *gorm.DB) error { return add(tx, "ord_a") }))
		}()
	}
	wg.Wait()
	require.NoError(t, add(db, "ord_b"))

	var rows []struct {
		AggregateID  string
		AggregateSeq int64
		Payload      string
	}
	require.NoError(t, db.Raw(`SELECT aggregate_id, aggregate_seq, payload::text AS payload FROM outbox ORDER BY seq`).Scan(&rows).Error)
	require.Len(t, rows, 21)
	var seqs []int64
	for _, r := range rows {
		var body struct {
			AggregateID string `json:"aggregate_id"`
			Sequence    int64  `json:"sequence"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.Payload), &body))
		require.True(t, strings.HasSuffix(r.Payload, fmt.Sprintf(`"aggregate_id":%q,"sequence":%d}`, r.AggregateID, r.AggregateSeq)),
			"the body json.Marshal gives with the sequence: %s", r.Payload)
		require.Equal(t, r.AggregateSeq, body.Sequence)
		require.Equal(t, r.AggregateID, body.AggregateID)
		if r.AggregateID == "ord_a" {
			seqs = append(seqs, r.AggregateSeq)
		} else {
			require.Equal(t, int64(1), r.AggregateSeq)
		}
	}
	// Inserted (bigserial seq) in the order the row lock let them through.
	for i, s := range seqs {
		require.Equal(t, int64(i+1), s)
	}
}
