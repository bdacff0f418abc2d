package stripestep

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
)

// Attempt is one row of payment_attempts: one attempt of one step of an
// order's saga, written before its call (Insert) and finished after it
// (Finish).
type Attempt struct {
	ID       int64
	OrderID  string
	TenantID string
	// Step is StepCreate, StepConfirm, StepCancel or RefundStep(id).
	Step string
	// Attempt is the attempt's number within its step, from 1.
	Attempt int
	// IdempotencyKey is Key(OrderID, Step, Attempt).
	IdempotencyKey string
	// PaymentIntentID is the PaymentIntent the step acts on (confirm,
	// cancel, refund), nil for a create.
	PaymentIntentID *string
	// RequestParams is what was sent (JSON), for the history and the
	// resend.
	RequestParams []byte
	// Outcome is Open while no final answer is recorded.
	Outcome Outcome
	// StripeObjectID and StripeStatus are the object Stripe answered with
	// ("pi_…", "re_…") and its status.
	StripeObjectID *string
	StripeStatus   *string
	// Error is the last error, for people (at most maxError bytes).
	Error     *string
	CreatedAt time.Time
	// UpdatedAt is when the attempt was last answered (or written).
	UpdatedAt time.Time
}

// TableName is payment_attempts.
func (Attempt) TableName() string { return "payment_attempts" }

// NewAttempt returns attempt n of step of the order, not yet written,
// with its key derived (Key). target is the PaymentIntent the step acts on
// ("" for none); params the request as JSON.
func NewAttempt(orderID, tenantID, step string, n int, target string, params []byte, now time.Time) *Attempt {
	a := &Attempt{OrderID: orderID, TenantID: tenantID, Step: step, Attempt: n,
		IdempotencyKey: Key(orderID, step, n), RequestParams: params, CreatedAt: now, UpdatedAt: now}
	if target != "" {
		a.PaymentIntentID = &target
	}
	return a
}

// Target returns the PaymentIntent the attempt acts on, "" for none.
func (a *Attempt) Target() string {
	if a.PaymentIntentID == nil {
		return ""
	}
	return *a.PaymentIntentID
}

// Resendable reports whether a's key may be sent again as it is at now:
// a is Open (no final answer recorded) and was written less than
// ResendWindow ago. An Open attempt older than that is reconciled with
// Stripe instead: Stripe may have forgotten its key.
func (a *Attempt) Resendable(now time.Time) bool {
	return a.Outcome == Open && now.Sub(a.CreatedAt) < ResendWindow
}

// Load returns the order's attempts of step (of every step when step is
// ""), ordered by step, then attempt.
func Load(ctx context.Context, db *gorm.DB, orderID, step string) ([]Attempt, error) {
	q := db.WithContext(ctx).Where("order_id = ?", orderID)
	if step != "" {
		q = q.Where("step = ?", step)
	}
	var as []Attempt
	if err := q.Order("step, attempt").Find(&as).Error; err != nil {
		return nil, fmt.Errorf("load payment attempts of %s: %w", orderID, err)
	}
	return as, nil
}

// Latest returns the order's attempt of step with the highest number, nil
// when the step has none.
func Latest(ctx context.Context, db *gorm.DB, orderID, step string) (*Attempt, error) {
	var as []Attempt
	err := db.WithContext(ctx).Where("order_id = ? AND step = ?", orderID, step).
		Order("attempt DESC").Limit(1).Find(&as).Error
	if err != nil {
		return nil, fmt.Errorf("load attempts of %s of %s: %w", step, orderID, err)
	}
	if len(as) == 0 {
		return nil, nil
	}
	return &as[0], nil
}

// ErrTaken is returned by Insert when the attempt was not written: another
// run wrote the same attempt first, or the fence no longer holds (the run's
// lease is gone). That run owns the step now.
var ErrTaken = errors.New("payment attempt taken by another run")

// GuardTaken is the batch guard (postgres.IsGuard) of QueueInsert: the
// attempt was written by another run first, and the batch wrote nothing,
// as ErrTaken.
const GuardTaken = "stripestep_attempt_taken"

// insertSQL writes an attempt (insertArgs) unless the same one exists
// (order, step, attempt, or key), and returns its id.
const insertSQL = `INSERT INTO payment_attempts
			(order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?::jsonb, ?, ?)
			ON CONFLICT DO NOTHING RETURNING id`

func insertArgs(a *Attempt) []any {
	return []any{a.OrderID, a.TenantID, a.Step, a.Attempt, a.IdempotencyKey, a.PaymentIntentID,
		string(a.RequestParams), a.CreatedAt, a.CreatedAt}
}

// Insert writes attempt a before its call and sets a.ID. It returns
// ErrTaken when another run wrote the same attempt (order, step, attempt,
// or key) first, and nothing was written. A run that holds an idempotency
// key writes its attempts fenced by the key's lease instead: the fence and
// QueueInsert in one batch.
func Insert(ctx context.Context, db *gorm.DB, a *Attempt) error {
	res := db.WithContext(ctx).Raw(insertSQL, insertArgs(a)...).Scan(&a.ID)
	if res.Error != nil {
		return fmt.Errorf("insert payment attempt %s: %w", a.IdempotencyKey, res.Error)
	}
	if res.RowsAffected != 1 {
		return ErrTaken
	}
	return nil
}

// QueueInsert queues in b what Insert does: a written before its call;
// a.ID is set once b commits. When another run wrote the same attempt
// first, the batch fails with GuardTaken.
func QueueInsert(b *postgres.Batch, a *Attempt) {
	var id int64
	b.QueueGuarded(GuardTaken, insertSQL, insertArgs(a), func(r pgx.Row) error { return r.Scan(&id) })
	b.AfterCommit(func() { a.ID = id })
}

// Answer is what Finish records of a call's answer.
type Answer struct {
	// Outcome is the attempt's outcome (OutcomeOf the call's error); Open
	// keeps it open and records only Error.
	Outcome Outcome
	// ObjectID and Status are the object Stripe answered with ("pi_…",
	// "re_…"), if any.
	ObjectID, Status string
	// Error is what the attempt keeps of the call's error, for people
	// (and for a saga that rebuilds a refusal from it); "" for none.
	Error string
}

// Finish records answer to attempt a at now: its outcome, the object
// Stripe answered with, and its error (cleared without one; kept to
// maxError bytes). An Open answer records only the error, and only on an
// attempt still open: a run that finished it meanwhile knows better.
func Finish(ctx context.Context, db *gorm.DB, a *Attempt, answer Answer, now time.Time) error {
	q, args := finishStatement(a, answer, now)
	if err := db.WithContext(ctx).Exec(q, args...).Error; err != nil {
		return fmt.Errorf("record payment attempt %s: %w", a.IdempotencyKey, err)
	}
	return nil
}

// QueueFinish queues in b what Finish does: answer recorded to attempt a
// at now, committed with the rest of b.
func QueueFinish(b *postgres.Batch, a *Attempt, answer Answer, now time.Time) {
	q, args := finishStatement(a, answer, now)
	b.Queue(q, args, nil)
}

// finishStatement returns Finish's statement and its arguments. It names
// the attempt by its idempotency key (unique, as its id is), which is
// known before the attempt is written: a batch that writes an attempt can
// record the previous one's answer without reading an id back.
func finishStatement(a *Attempt, answer Answer, now time.Time) (string, []any) {
	var errText any
	if answer.Error != "" {
		errText = clip(answer.Error)
	}
	if answer.Outcome == Open {
		return `UPDATE payment_attempts SET error = ?, updated_at = ? WHERE idempotency_key = ? AND outcome IS NULL`,
			[]any{errText, now, a.IdempotencyKey}
	}
	var objID, status any
	if answer.ObjectID != "" {
		objID, status = answer.ObjectID, answer.Status
	}
	return `UPDATE payment_attempts SET outcome = ?,
		    stripe_object_id = COALESCE(?, stripe_object_id), stripe_status = COALESCE(?, stripe_status),
		    error = ?, updated_at = ?
		WHERE idempotency_key = ?`,
		[]any{string(answer.Outcome), objID, status, errText, now, a.IdempotencyKey}
}

// maxError is the most of an error message payment_attempts.error keeps.
const maxError = 1000

// clip cuts s to at most maxError bytes, on a character boundary.
func clip(s string) string {
	if len(s) <= maxError {
		return s
	}
	s = s[:maxError]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
