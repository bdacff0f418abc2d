package inbox

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Sequenced is one event of an aggregate's sequence as a consumer received
// it: outbox.Event's AggregateID and Sequence, and the message itself.
type Sequenced struct {
	MessageID   string
	AggregateID string
	// Seq is 1 for the aggregate's first event, then 2, 3, … without gaps.
	Seq  int64
	Body []byte
	// TraceParent is the W3C traceparent of the span that received the
	// event ("" outside a trace). A parked event keeps it, so that what it
	// causes when it is applied later joins its own trace.
	TraceParent string
}

// Admission is what Admit decided about one event.
type Admission struct {
	// Apply lists the events to apply now, in this order, in the caller's
	// transaction: the admitted event, then the parked events it unblocked.
	// Empty when the event was parked.
	Apply []Sequenced
	// Parked is true when the event came before its predecessor: it is
	// stored until the predecessor is applied or ReleaseOverdue lets it go.
	Parked bool
	// Late is true when the event's successors were already applied (it was
	// given up on by ReleaseOverdue, then arrived): it is applied anyway,
	// out of order.
	Late bool
}

// Admit decides, inside tx, whether ev is the next event of its aggregate
// for consumer, which must already have recorded ev with Record (first ==
// true) in the same tx: this is the resequencer pattern
// (https://www.enterpriseintegrationpatterns.com/patterns/messaging/Resequencer.html)
// with its buffer in the database, so a parked event survives a crash and
// holds no broker delivery or handler slot while it waits.
//
// It locks the aggregate's cursor row (the highest sequence applied without
// a gap), so two consumers of one aggregate take turns. When ev.Seq is the
// next one, the cursor moves past it and past every parked successor that
// follows without a gap, and all of them are returned to be applied (the
// parked ones are removed from parking). When ev.Seq is further ahead, ev is
// parked and nothing is returned. When ev.Seq is behind the cursor, it is
// returned with Late set.
//
// An event in order, and one parked, cost one statement: admitStatement
// locks the cursor, moves it or parks ev, and returns the cursor's highest
// parked sequence (parked_max, migration 00014); only when that lies past
// ev does a second statement look for parked successors.
//
// Commit makes the cursor, the parking and the caller's effects durable
// together; rollback undoes all of them, and the redelivered message is
// admitted again.
func Admit(ctx context.Context, tx *gorm.DB, consumer string, ev Sequenced) (Admission, error) {
	if ev.AggregateID == "" || ev.Seq < 1 {
		return Admission{}, fmt.Errorf("inbox: admit %s: aggregate id and a positive sequence are required", ev.MessageID)
	}
	tx = tx.WithContext(ctx)
	var cur []struct{ AppliedSeq, ParkedMax int64 }
	err := tx.Raw(admitStatement, map[string]any{"consumer": consumer, "aggregate": ev.AggregateID,
		"seq": ev.Seq, "message": ev.MessageID, "body": ev.Body, "traceparent": nullable(ev.TraceParent)}).Scan(&cur).Error
	if err != nil {
		return Admission{}, fmt.Errorf("inbox: admit %s: %w", ev.MessageID, err)
	}
	switch {
	case len(cur) == 0: // the cursor was at or past ev: left as it was
		return Admission{Apply: []Sequenced{ev}, Late: true}, nil
	case cur[0].AppliedSeq < ev.Seq:
		return Admission{Parked: true}, nil
	case cur[0].ParkedMax <= ev.Seq: // nothing parked after ev
		return Admission{Apply: []Sequenced{ev}}, nil
	}
	apply, err := drain(tx, consumer, ev.AggregateID, ev.Seq, []Sequenced{ev})
	if err != nil {
		return Admission{}, err
	}
	return Admission{Apply: apply}, nil
}

// admitStatement is Admit's one statement (named arguments consumer,
// aggregate, seq, message, body, traceparent). The upsert takes the cursor's
// row lock (waiting for a consumer that holds it) and then reads that row
// as it is now, not as the statement's snapshot saw it: so its parked_max
// includes what a consumer that parked a successor meanwhile wrote, which
// a read of inbox_parked in this same statement (one snapshot) could miss.
// Its WHERE leaves a cursor at or past ev untouched and then returns no
// row: ev is late. The row is locked all the same ("all rows will be
// locked when the ON CONFLICT DO UPDATE action is taken",
// https://www.postgresql.org/docs/15/sql-insert.html), so a late event
// still takes its turn. Otherwise the cursor moves to ev when ev
// is its next, or ev is parked and parked_max raised; the row returned
// tells which (applied_seq = ev's sequence, or below it).
const admitStatement = `WITH cur AS (
	INSERT INTO inbox_sequences AS s (consumer, aggregate_id, applied_seq, parked_max)
	VALUES (@consumer, @aggregate, CASE WHEN CAST(@seq AS bigint) = 1 THEN 1 ELSE 0 END,
		CASE WHEN CAST(@seq AS bigint) = 1 THEN 0 ELSE CAST(@seq AS bigint) END)
	ON CONFLICT (consumer, aggregate_id) DO UPDATE SET
		applied_seq = CASE WHEN s.applied_seq = CAST(@seq AS bigint) - 1 THEN CAST(@seq AS bigint) ELSE s.applied_seq END,
		parked_max = CASE WHEN s.applied_seq = CAST(@seq AS bigint) - 1 THEN s.parked_max
			ELSE greatest(s.parked_max, CAST(@seq AS bigint)) END,
		updated_at = now()
	WHERE s.applied_seq < CAST(@seq AS bigint)
	RETURNING applied_seq, parked_max
), park AS (
	INSERT INTO inbox_parked (consumer, aggregate_id, seq, message_id, body, traceparent)
	SELECT @consumer, @aggregate, CAST(@seq AS bigint), @message, @body, CAST(@traceparent AS text) FROM cur WHERE cur.applied_seq < CAST(@seq AS bigint)
	ON CONFLICT DO NOTHING
)
SELECT applied_seq, parked_max FROM cur`

// Hold tells ReleaseOverdue, inside tx, whether to keep aggregateID's
// parked event seq (its cursor at applied) parked although it is overdue.
type Hold func(ctx context.Context, tx *gorm.DB, aggregateID string, applied, seq int64) (bool, error)

// ReleaseOverdue lets go, inside tx, of the events consumer has parked for
// longer than wait: for up to limit aggregates whose lowest parked event is
// overdue, it moves the cursor past the missing predecessors to that event
// and its parked successors without a gap, removes them from parking and
// returns them to be applied in order. skipped counts the sequence numbers
// given up on (their events may still arrive, late).
//
// Aggregates whose cursor another transaction holds are skipped (FOR UPDATE
// SKIP LOCKED): a consumer is applying their events right now. So are those
// hold (nil: none) keeps: it is asked, inside tx, about the aggregate, its
// cursor (applied) and its lowest overdue parked event (seq), and returns
// true to keep that event parked past the wait. Commit and rollback mean
// what they mean for Admit.
func ReleaseOverdue(ctx context.Context, tx *gorm.DB, consumer string, wait time.Duration, limit int, hold Hold) (apply []Sequenced, skipped int64, err error) {
	tx = tx.WithContext(ctx)
	var aggregates []string
	err = tx.Raw(`SELECT aggregate_id FROM inbox_parked
		WHERE consumer = ? AND parked_at < now() - ?::interval
		GROUP BY aggregate_id ORDER BY min(parked_at) LIMIT ?`,
		consumer, wait.String(), limit).Scan(&aggregates).Error
	if err != nil {
		return nil, 0, fmt.Errorf("inbox: list overdue parked events: %w", err)
	}
	for _, agg := range aggregates {
		// The cursor exists: Admit writes it in the transaction that parks,
		// and the reaper keeps cursors that have parked events.
		var applied []int64
		if err := tx.Raw(`SELECT applied_seq FROM inbox_sequences WHERE consumer = ? AND aggregate_id = ?
			FOR UPDATE SKIP LOCKED`, consumer, agg).Scan(&applied).Error; err != nil {
			return nil, 0, fmt.Errorf("inbox: lock cursor of %s: %w", agg, err)
		}
		if len(applied) == 0 {
			continue // a consumer holds it
		}
		var first []Sequenced
		if err := tx.Raw(`SELECT `+parkedColumns+` FROM inbox_parked
			WHERE consumer = ? AND aggregate_id = ? AND parked_at < now() - ?::interval
			ORDER BY seq LIMIT 1`, consumer, agg, wait.String()).Scan(&first).Error; err != nil {
			return nil, 0, fmt.Errorf("inbox: load parked event of %s: %w", agg, err)
		}
		if len(first) == 0 {
			continue // released meanwhile
		}
		ev := first[0]
		if hold != nil {
			held, err := hold(ctx, tx, agg, applied[0], ev.Seq)
			if err != nil {
				return nil, 0, fmt.Errorf("inbox: hold %s: %w", agg, err)
			}
			if held {
				continue
			}
		}
		if err := tx.Exec(`DELETE FROM inbox_parked WHERE consumer = ? AND aggregate_id = ? AND seq = ?`,
			consumer, agg, ev.Seq).Error; err != nil {
			return nil, 0, fmt.Errorf("inbox: unpark %s: %w", ev.MessageID, err)
		}
		if ev.Seq > applied[0]+1 {
			skipped += ev.Seq - applied[0] - 1
		}
		evs, err := drain(tx, consumer, agg, ev.Seq, []Sequenced{ev})
		if err != nil {
			return nil, 0, err
		}
		apply = append(apply, evs...)
	}
	return apply, skipped, nil
}

// drain moves the locked cursor to seq, then past each parked event that
// follows without a gap, removing those from parking; it returns apply with
// them appended in order.
func drain(tx *gorm.DB, consumer, aggregateID string, seq int64, apply []Sequenced) ([]Sequenced, error) {
	for {
		var next []Sequenced
		err := tx.Raw(`DELETE FROM inbox_parked WHERE consumer = ? AND aggregate_id = ? AND seq = ?
			RETURNING `+parkedColumns, consumer, aggregateID, seq+1).Scan(&next).Error
		if err != nil {
			return nil, fmt.Errorf("inbox: unpark %s #%d: %w", aggregateID, seq+1, err)
		}
		if len(next) == 0 {
			break
		}
		apply = append(apply, next[0])
		seq++
	}
	err := tx.Exec(`UPDATE inbox_sequences SET applied_seq = greatest(applied_seq, ?), updated_at = now()
		WHERE consumer = ? AND aggregate_id = ?`, seq, consumer, aggregateID).Error
	if err != nil {
		return nil, fmt.Errorf("inbox: advance cursor of %s: %w", aggregateID, err)
	}
	return apply, nil
}

// parkedColumns are the columns of inbox_parked that make a Sequenced.
const parkedColumns = `message_id, aggregate_id, seq, body, coalesce(traceparent, '') AS trace_parent`

// nullable is s, or NULL for "".
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
