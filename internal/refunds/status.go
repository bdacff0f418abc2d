package refunds

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"gorm.io/gorm"
)

// Status is a refund's status (refunds.status), one of the constants
// below. Stripe's own status of the refund is kept beside it
// (refunds.stripe_status); ourStatus maps one to the other.
type Status string

// Refund statuses (ours; Stripe's pending and requires_action are pending,
// its canceled is failed). Which one may follow which is the table next,
// and nothing else.
const (
	// StatusPending: created, not settled by Stripe yet.
	StatusPending Status = "pending"
	// StatusSucceeded: Stripe refunded it; counted in amount_refunded.
	StatusSucceeded Status = "succeeded"
	// StatusFailed: Stripe refused, failed or canceled it; its amount is
	// refundable again.
	StatusFailed Status = "failed"
	// StatusRequiresAttention: the create stayed indeterminate for
	// RetryAfter and the refund is not found at Stripe. It is never sent
	// again under a new key (a refund cannot be canceled, so a late
	// roll-forward of the first attempt would refund twice); its amount
	// stays reserved, it is counted (checkout_refunds_requiring_attention)
	// and alerted on, and ReconcileParked keeps looking for it at Stripe.
	// Like pending, it is not settled: Stripe's refund, if it appears,
	// moves it to pending, succeeded or failed.
	StatusRequiresAttention Status = "requires_attention"
)

// transitions is the refund lifecycle: for each status, the statuses it may
// move to. Every status is a key; failed maps to nothing. succeeded may
// still become failed: Stripe can fail a refund after it succeeded
// (https://docs.stripe.com/refunds#failed-refunds), and nothing else
// leaves a settled refund.
var transitions = map[Status][]Status{
	StatusPending:           {StatusSucceeded, StatusFailed, StatusRequiresAttention},
	StatusRequiresAttention: {StatusPending, StatusSucceeded, StatusFailed},
	StatusSucceeded:         {StatusFailed},
	StatusFailed:            nil,
}

// statuses lists every status in the order of the lifecycle.
var statuses = []Status{StatusPending, StatusRequiresAttention, StatusSucceeded, StatusFailed}

// froms is transitions inverted: for each status, the statuses that may
// move to it, in the order of statuses. move's WHERE clause names them.
var froms = func() map[Status][]string {
	m := map[Status][]string{}
	for _, from := range statuses {
		for _, to := range transitions[from] {
			m[to] = append(m[to], string(from))
		}
	}
	return m
}()

// Statuses returns every refund status, in the order of the lifecycle.
func Statuses() []Status { return slices.Clone(statuses) }

// Valid reports whether s is one of the statuses.
func (s Status) Valid() bool {
	_, ok := transitions[s]
	return ok
}

// CanMoveTo reports whether a refund in s may move to to.
func (s Status) CanMoveTo(to Status) bool { return slices.Contains(transitions[s], to) }

// Open reports whether Stripe has not settled a refund in s yet (pending,
// requires_attention): the statuses that may still become succeeded. Its
// amount is reserved and not refunded.
func (s Status) Open() bool { return s.CanMoveTo(StatusSucceeded) }

// ErrNoTransition is returned by move for a status that no status may move
// to, or one that is not a status.
var ErrNoTransition = errors.New("no transition to that refund status")

// move moves refund id to status to inside tx, setting the columns of set
// with it (and updated_at to now), if the refund's status may move to to
// (the transitions table): one conditional UPDATE, the only write of
// refunds.status after a refund is inserted. It reports whether the refund
// moved; false means it was in no status to may follow (already there or
// past it). It returns ErrNoTransition for a to nothing moves to.
func move(ctx context.Context, tx *gorm.DB, id string, to Status, set map[string]any, now time.Time) (bool, error) {
	from := froms[to]
	if len(from) == 0 {
		return false, fmt.Errorf("refund %s to %q: %w", id, to, ErrNoTransition)
	}
	cols := maps.Clone(set)
	if cols == nil {
		cols = map[string]any{}
	}
	cols["status"], cols["updated_at"] = string(to), now
	res := tx.WithContext(ctx).Model(&refundRow{}).Where("id = ? AND status IN ?", id, from).Updates(cols)
	if res.Error != nil {
		return false, fmt.Errorf("refund %s to %s: %w", id, to, res.Error)
	}
	return res.RowsAffected == 1, nil
}

// touch records that refund id, while still in status, was looked at now
// (updated_at): the reconciler's next look comes an interval later, not
// at once. It moves no status; a refund that moved meanwhile is left as
// it is.
func touch(ctx context.Context, db *gorm.DB, id string, status Status, now time.Time) error {
	err := db.WithContext(ctx).Model(&refundRow{}).Where("id = ? AND status = ?", id, string(status)).Update("updated_at", now).Error
	if err != nil {
		return fmt.Errorf("touch refund %s: %w", id, err)
	}
	return nil
}
