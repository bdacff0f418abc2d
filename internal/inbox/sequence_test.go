package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/inbox"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgbenchsql"
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
	adm, err := deliverAs(db, fmt.Sprintf("evt_%s_%d", agg, seq), agg, seq)
	require.NoError(t, err)
	return adm
}

// deliverAs is deliver under message id id, returning its error: for a
// goroutine, where require cannot stop the test, and for a second copy of
// an event under another id. A message already recorded is not admitted
// (the zero Admission).
func deliverAs(db *gorm.DB, id, agg string, seq int64) (inbox.Admission, error) {
	var adm inbox.Admission
	err := postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
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
	})
	return adm, err
}

func applied(t *testing.T, db *gorm.DB, agg string) []int64 {
	t.Helper()
	var seqs []int64
	require.NoError(t, db.Raw(`SELECT seq FROM applied WHERE aggregate_id = ? ORDER BY n`, agg).Scan(&seqs).Error)
	return seqs
}

// requireNothingParked fails the test when any event is still parked.
func requireNothingParked(t *testing.T, db *gorm.DB) {
	t.Helper()
	var parked int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM inbox_parked`).Scan(&parked).Error)
	require.Zero(t, parked, "events still parked")
}

// releaseOverdue runs inbox.ReleaseOverdue for consumer "c" in a
// transaction of its own and returns what it released and skipped.
func releaseOverdue(t *testing.T, db *gorm.DB, wait time.Duration) ([]inbox.Sequenced, int64) {
	t.Helper()
	var evs []inbox.Sequenced
	var skipped int64
	require.NoError(t, postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
		var err error
		evs, skipped, err = inbox.ReleaseOverdue(context.Background(), tx, "c", wait, 10, nil)
		return err
	}))
	return evs, skipped
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
	requireNothingParked(t, db)
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

	release := func(wait time.Duration) ([]inbox.Sequenced, int64) { return releaseOverdue(t, db, wait) }
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

// TestAdmitUnparksWhatAConsumerItWaitedForParked: a consumer parks 3 and
// holds the cursor; another, admitting 2, waits for that lock. When the
// first commits, the second must apply 2 and then 3, although 3's parking
// committed after its statement began: a check of inbox_parked in the
// statement that waited (one snapshot, taken before the wait) misses it,
// and 3 would wait for ReleaseOverdue.
func TestAdmitUnparksWhatAConsumerItWaitedForParked(t *testing.T) {
	t.Parallel()
	db := setup(t)
	require.Len(t, deliver(t, db, "ord_w", 1).Apply, 1)

	ctx := context.Background()
	parker := db.Begin()
	require.NoError(t, parker.Error)
	adm, err := inbox.Admit(ctx, parker, "c", inbox.Sequenced{MessageID: "evt_w_3", AggregateID: "ord_w", Seq: 3, Body: []byte("{}")})
	require.NoError(t, err)
	require.True(t, adm.Parked)

	type result struct {
		adm inbox.Admission
		err error
	}
	done := make(chan result, 1)
	go func() {
		adm, err := deliverAs(db, "evt_w_2", "ord_w", 2)
		done <- result{adm, err}
	}()
	// The second consumer is waiting for the cursor's row lock.
	require.Eventually(t, func() bool {
		var waiting int64
		err := db.Raw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting).Error
		return err == nil && waiting == 1
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, parker.Commit().Error)

	r := <-done
	require.NoError(t, r.err)
	got := r.adm
	require.Len(t, got.Apply, 2)
	require.Equal(t, []int64{2, 3}, []int64{got.Apply[0].Seq, got.Apply[1].Seq})
	require.Equal(t, []int64{1, 2, 3}, applied(t, db, "ord_w"))
	requireNothingParked(t, db)
}

// TestAdmitInOrderIsOneStatement: an event that is its aggregate's next,
// with nothing parked, costs the consumer's transaction one statement of
// the cursor's and parking's tables (the round trips are most of the
// worker's CPU per event); so do a parked one and a late one; one that
// unblocks a parked successor costs the statements that unpark it.
func TestAdmitInOrderIsOneStatement(t *testing.T) {
	t.Parallel()
	db := setup(t)
	rec, err := pgbenchsql.Record(db)
	require.NoError(t, err)
	var statements int
	admit := func(id string, seq int64) inbox.Admission {
		rec.Start()
		adm, err := deliverAs(db, id, "ord_s", seq)
		require.NoError(t, err)
		statements = 0
		for _, sql := range rec.Stop() {
			if strings.Contains(sql, "inbox_sequences") || strings.Contains(sql, "inbox_parked") {
				statements++
			}
		}
		return adm
	}
	require.Len(t, admit("evt_1", 1).Apply, 1)
	require.Equal(t, 1, statements, "first event")
	require.Len(t, admit("evt_2", 2).Apply, 1)
	require.Equal(t, 1, statements, "next event")
	require.True(t, admit("evt_4", 4).Parked)
	require.Equal(t, 1, statements, "parked event")
	require.Len(t, admit("evt_3", 3).Apply, 2)
	require.Equal(t, 4, statements, "admit, unpark 4, look for 5, move the cursor")
	require.True(t, admit("evt_2_again", 2).Late)
	require.Equal(t, 1, statements, "late event")
	require.Len(t, admit("evt_5", 5).Apply, 1)
	require.Equal(t, 1, statements, "next event after the parked ones")
	require.Equal(t, []int64{1, 2, 3, 4, 2, 5}, applied(t, db, "ord_s"))
}

// TestMigration00014FindsWhatWasParkedBefore: a cursor at 1 and event 3
// parked by a worker of before migration 00014; after it, admitting 2
// applies 2 and then 3 at once (the backfill raised parked_max), instead
// of leaving 3 to ReleaseOverdue. The migration also goes down and up.
func TestMigration00014FindsWhatWasParkedBefore(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	pgtest.MigrateDownTo(t, db, 13)
	require.NoError(t, db.Exec(`INSERT INTO inbox_sequences (consumer, aggregate_id, applied_seq) VALUES ('c', 'ord_m', 1)`).Error)
	require.NoError(t, db.Exec(`INSERT INTO inbox_parked (consumer, aggregate_id, seq, message_id, body)
		VALUES ('c', 'ord_m', 3, 'evt_ord_m_3', '{}')`).Error)

	require.NoError(t, postgres.Migrate(ctx, db, slog.New(slog.DiscardHandler)))
	got := deliver(t, db, "ord_m", 2)
	require.Len(t, got.Apply, 2)
	require.Equal(t, []int64{2, 3}, []int64{got.Apply[0].Seq, got.Apply[1].Seq})

	pgtest.MigrateDownTo(t, db, 13)
	require.NoError(t, postgres.Migrate(ctx, db, slog.New(slog.DiscardHandler)))
}

// TestAnEventParkedWithoutParkedMaxIsLateNotLost: the rollout window of
// migration 00014. A worker of before it parks 3 without raising the
// cursor's parked_max (written here as it wrote it); a new worker admitting
// 2 cannot see it, so 3 stays parked, and ReleaseOverdue lets it go after
// the wait, with no sequence number skipped: late, never lost.
func TestAnEventParkedWithoutParkedMaxIsLateNotLost(t *testing.T) {
	t.Parallel()
	db := setup(t)
	require.Len(t, deliver(t, db, "ord_r", 1).Apply, 1)
	require.NoError(t, db.Exec(`INSERT INTO inbox_parked (consumer, aggregate_id, seq, message_id, body, parked_at)
		VALUES ('c', 'ord_r', 3, 'evt_ord_r_3', '{}', now() - interval '1 minute')`).Error)

	got := deliver(t, db, "ord_r", 2)
	require.Len(t, got.Apply, 1)
	require.EqualValues(t, 2, got.Apply[0].Seq)

	evs, skipped := releaseOverdue(t, db, 30*time.Second)
	require.Len(t, evs, 1)
	require.EqualValues(t, 3, evs[0].Seq)
	require.Zero(t, skipped)
	requireNothingParked(t, db)
	require.True(t, deliver(t, db, "ord_r", 3).Late, "the cursor is past 3")
}
