package stripestep

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"
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

// Sent reports whether an attempt of step of the order, acting on
// PaymentIntent target, was written with the request parameter param (a
// top-level key of RequestParams) equal to value: e.g. whether a cancel of
// pi_… asked for cancellation_reason requested_by_customer.
func Sent(ctx context.Context, db *gorm.DB, orderID, step, target, param, value string) (bool, error) {
	var n int64
	err := db.WithContext(ctx).Raw(`
		SELECT count(*) FROM payment_attempts
		WHERE order_id = ? AND step = ? AND payment_intent_id = ? AND request_params->>(?::text) = ?`,
		orderID, step, target, param, value).Scan(&n).Error
	if err != nil {
		return false, fmt.Errorf("load %s attempts of %s: %w", step, orderID, err)
	}
	return n > 0, nil
}

// Fence is the condition a fenced write of the log is made under, as an
// SQL boolean expression and its arguments: e.g. "the idempotency key
// that runs this saga is still leased to this run", which the key's owner
// supplies. The zero Fence writes unconditionally.
type Fence struct {
	Cond string
	Args []any
}

// ErrTaken is returned by Insert when the attempt was not written: another
// run wrote the same attempt first, or the fence no longer holds (the run's
// lease is gone). That run owns the step now.
var ErrTaken = errors.New("payment attempt taken by another run")

// Insert writes attempt a before its call, only while fence holds, and
// sets a.ID. It returns ErrTaken when another run wrote the same attempt
// (order, step, attempt, or key) first or the fence does not hold, and
// nothing was written.
func Insert(ctx context.Context, db *gorm.DB, a *Attempt, fence Fence) error {
	q, args := InsertStatement(a, fence)
	res := db.WithContext(ctx).Raw(q+` RETURNING id`, args...).Scan(&a.ID)
	if res.Error != nil {
		return fmt.Errorf("insert payment attempt %s: %w", a.IdempotencyKey, res.Error)
	}
	if res.RowsAffected != 1 {
		return ErrTaken
	}
	return nil
}

// InsertStatement returns Insert's statement, without its RETURNING, and
// its arguments, for a caller that writes the attempt together with other
// rows in one statement of data-modifying CTEs (add "RETURNING id" to read
// the attempt's id back: no row when it was not written).
func InsertStatement(a *Attempt, fence Fence) (string, []any) {
	q := `INSERT INTO payment_attempts
			(order_id, tenant_id, step, attempt, idempotency_key, payment_intent_id, request_params, created_at, updated_at)
			SELECT ?, ?, ?, ?, ?, ?, ?::jsonb, ?, ?`
	args := []any{a.OrderID, a.TenantID, a.Step, a.Attempt, a.IdempotencyKey, a.PaymentIntentID,
		string(a.RequestParams), a.CreatedAt, a.CreatedAt}
	if fence.Cond != "" {
		q += ` WHERE ` + fence.Cond
		args = append(args, fence.Args...)
	}
	return q + ` ON CONFLICT DO NOTHING`, args
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

// Finish records answer to attempt id at now: its outcome, the object
// Stripe answered with, and its error (cleared without one; kept to
// maxError bytes). An Open answer records only the error, and only on an
// attempt still open: a run that finished it meanwhile knows better.
func Finish(ctx context.Context, db *gorm.DB, id int64, answer Answer, now time.Time) error {
	q, args := FinishStatement(id, answer, now)
	if err := db.WithContext(ctx).Exec(q, args...).Error; err != nil {
		return fmt.Errorf("record payment attempt %d: %w", id, err)
	}
	return nil
}

// FinishStatement returns Finish's statement and its arguments, for a
// caller that records the answer together with other rows in one
// statement.
func FinishStatement(id int64, answer Answer, now time.Time) (string, []any) {
	var errText any
	if answer.Error != "" {
		errText = clip(answer.Error)
	}
	if answer.Outcome == Open {
		return `UPDATE payment_attempts SET error = ?, updated_at = ? WHERE id = ? AND outcome IS NULL`,
			[]any{errText, now, id}
	}
	var objID, status any
	if answer.ObjectID != "" {
		objID, status = answer.ObjectID, answer.Status
	}
	return `UPDATE payment_attempts SET outcome = ?,
		    stripe_object_id = COALESCE(?, stripe_object_id), stripe_status = COALESCE(?, stripe_status),
		    error = ?, updated_at = ?
		WHERE id = ?`,
		[]any{string(answer.Outcome), objID, status, errText, now, id}
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
