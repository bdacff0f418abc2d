package inbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/inbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

// deliver records and admits one event in a transaction of its own, as a
// consumer does, and applies what Admit returns by appending it to the
// table applied, in the same transaction.
func deliver(t *testing.T, db *gorm.DB, agg string, seq int64) inbox.Admission {
	t.Helper()
	var adm inbox.Admission
	id := fmt.Sprintf("evt_%s_%d", agg, seq)
	require.NoError(t, postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
		first, err := inbox.Record(context.Background(), tx, "c", id)
		if err != nil || !first {
			return err
		}
		adm, err = inbox.Admit(context.Background(), tx, "c", inbox.Sequenced{MessageID: id, AggregateID: agg, Seq: seq, Body: []byte("{}")})
		if err != nil {
			return err
		}
		for _, ev := range adm.Apply {
			if err := tx.Exec(`INSERT INTO applied (aggregate_id, seq) VALUES (?, ?)`, ev.AggregateID, ev.Seq).Error; err != nil {
				return err
			}
		}
		return nil
	}))
	return adm
}

func applied(t *testing.T, db *gorm.DB, agg string) []int64 {
	t.Helper()
	var seqs []int64
	require.NoError(t, db.Raw(`SELECT seq FROM applied WHERE aggregate_id = ? ORDER BY n`, agg).Scan(&seqs).Error)
	return seqs
}

func setup(t *testing.T) *gorm.DB {
	t.Helper()
	db, _ := pgtest.NewDB(t)
	require.NoError(t, db.Exec(`CREATE TABLE applied (n bigserial PRIMARY KEY, aggregate_id text, seq bigint)`).Error)
	return db
}

// TestAdmitAppliesInSequenceWhateverTheArrivalOrder: 30 events of each of
// 3 aggregates arrive shuffled, from 8 goroutines at once, each delivered
// twice: every aggregate's events are applied exactly once, in sequence.
func TestAdmitAppliesInSequenceWhateverTheArrivalOrder(t *testing.T) {
	t.Parallel()
	db := setup(t)
	type delivery struct {
		agg string
		seq int64
	}
	var all []delivery
	for _, agg := range []string{"ord_a", "ord_b", "ord_c"} {
		for seq := int64(1); seq <= 30; seq++ {
			all = append(all, delivery{agg, seq}, delivery{agg, seq})
		}
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	work := make(chan delivery)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range work {
				deliver(t, db, d.agg, d.seq)
			}
		}()
	}
	for _, d := range all {
		work <- d
	}
	close(work)
	wg.Wait()
	want := make([]int64, 30)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for _, agg := range []string{"ord_a", "ord_b", "ord_c"} {
		require.Equal(t, want, applied(t, db, agg), agg)
	}
	var parked int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM inbox_parked`).Scan(&parked).Error)
	require.Zero(t, parked)
}

// TestReleaseOverdueSkipsTheGapAndALateEventStillApplies: 1 applied, 2
// lost, 3 and 4 parked. Before the wait nothing is released; after it 3 and
// 4 are (one sequence number skipped); 2 arriving then is applied as late.
func TestReleaseOverdueSkipsTheGapAndALateEventStillApplies(t *testing.T) {
	t.Parallel()
	db := setup(t)
	require.Len(t, deliver(t, db, "ord_x", 1).Apply, 1)
	require.True(t, deliver(t, db, "ord_x", 4).Parked)
	require.True(t, deliver(t, db, "ord_x", 3).Parked)

	release := func(wait time.Duration) ([]inbox.Sequenced, int64) {
		var evs []inbox.Sequenced
		var skipped int64
		require.NoError(t, postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
			var err error
			evs, skipped, err = inbox.ReleaseOverdue(context.Background(), tx, "c", wait, 10)
			return err
		}))
		return evs, skipped
	}
	evs, _ := release(time.Hour)
	require.Empty(t, evs)
	require.NoError(t, db.Exec(`UPDATE inbox_parked SET parked_at = now() - interval '1 minute'`).Error)
	evs, skipped := release(30 * time.Second)
	require.Len(t, evs, 2)
	require.Equal(t, []int64{3, 4}, []int64{evs[0].Seq, evs[1].Seq})
	require.EqualValues(t, 1, skipped)

	late := deliver(t, db, "ord_x", 2)
	require.True(t, late.Late)
	require.Len(t, late.Apply, 1)
	require.True(t, deliver(t, db, "ord_x", 6).Parked)
	next := deliver(t, db, "ord_x", 5)
	require.Equal(t, []int64{5, 6}, []int64{next.Apply[0].Seq, next.Apply[1].Seq})
}
