package stripestep_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/stripestep"
)

// TestLog: an attempt is written once (a second writer of the same attempt
// gets ErrTaken, or in a batch GuardTaken, and writes nothing), is
// read back with its outcome Open (NULL), and an answer recorded Open only
// touches an attempt still open.
func TestLog(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	require.NoError(t, db.Exec(`
		INSERT INTO orders (id, tenant_id, status, email, currency, amount_total, payment_method, created_at, updated_at)
		VALUES ('ord_1', 'acme', 'pending_payment', 'buyer@example.com', 'usd', 2500, 'pm_card_visa', ?, ?)`, now, now).Error)

	a := stripestep.NewAttempt("ord_1", "acme", stripestep.StepCreate, 1, "", []byte(`{"amount":2500}`), now)
	require.NoError(t, stripestep.Insert(ctx, db, a))
	require.NotZero(t, a.ID)
	again := stripestep.NewAttempt("ord_1", "acme", stripestep.StepCreate, 1, "", []byte(`{}`), now)
	require.ErrorIs(t, stripestep.Insert(ctx, db, again), stripestep.ErrTaken, "written by another run")
	require.Zero(t, again.ID)

	// In a batch: the same attempt fails the batch, and its other writes.
	var b postgres.Batch
	b.Queue(`UPDATE orders SET email = 'changed@example.com' WHERE id = 'ord_1'`, nil, nil)
	stripestep.QueueInsert(&b, again)
	require.True(t, postgres.IsGuard(postgres.Send(ctx, db, &b), stripestep.GuardTaken))
	require.Zero(t, again.ID)
	var email string
	require.NoError(t, db.Raw(`SELECT email FROM orders WHERE id = 'ord_1'`).Scan(&email).Error)
	require.Equal(t, "buyer@example.com", email, "nothing of the batch is written")
	confirm := stripestep.NewAttempt("ord_1", "acme", stripestep.StepConfirm, 1, "pi_0", []byte(`{}`), now)
	var ok postgres.Batch
	stripestep.QueueInsert(&ok, confirm)
	stripestep.QueueFinish(&ok, a, stripestep.Answer{Error: "first"}, now)
	require.NoError(t, postgres.Send(ctx, db, &ok))
	require.NotZero(t, confirm.ID, "set once the batch committed")
	require.NoError(t, db.Exec(`DELETE FROM payment_attempts WHERE id = ?`, confirm.ID).Error)

	as, err := stripestep.Load(ctx, db, "ord_1", stripestep.StepCreate)
	require.NoError(t, err)
	require.Len(t, as, 1)
	require.Equal(t, stripestep.Open, as[0].Outcome)
	require.Equal(t, "ord_1/create/1", as[0].IdempotencyKey)
	require.JSONEq(t, `{"amount":2500}`, string(as[0].RequestParams))

	later := now.Add(time.Second)
	require.NoError(t, stripestep.Finish(ctx, db, a, stripestep.Answer{Error: "timeout"}, later))
	last, err := stripestep.Latest(ctx, db, "ord_1", stripestep.StepCreate)
	require.NoError(t, err)
	require.Equal(t, stripestep.Open, last.Outcome)
	require.Equal(t, "timeout", *last.Error)
	require.True(t, last.UpdatedAt.Equal(later))

	require.NoError(t, stripestep.Finish(ctx, db, a,
		stripestep.Answer{Outcome: stripestep.Succeeded, ObjectID: "pi_1", Status: "requires_confirmation"}, later))
	require.NoError(t, stripestep.Finish(ctx, db, a, stripestep.Answer{Error: "late"}, later.Add(time.Second)))
	last, err = stripestep.Latest(ctx, db, "ord_1", stripestep.StepCreate)
	require.NoError(t, err)
	require.Equal(t, stripestep.Succeeded, last.Outcome, "an Open answer never reopens an answered attempt")
	require.Equal(t, "pi_1", *last.StripeObjectID)
	require.Nil(t, last.Error, "the success cleared the error, the late Open answer wrote none")
	require.True(t, last.UpdatedAt.Equal(later))

	none, err := stripestep.Latest(ctx, db, "ord_1", stripestep.StepConfirm)
	require.NoError(t, err)
	require.Nil(t, none)
}

type refusal struct{ declined bool }

func (r refusal) Error() string { return "refused" }
func (r refusal) StepOutcome() stripestep.Outcome {
	if r.declined {
		return stripestep.Failed
	}
	return stripestep.Rejected
}

// TestOutcomeOf: every answer an adapter gives maps to one outcome, and
// only the answers Stripe gave for good are final.
func TestOutcomeOf(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err   error
		want  stripestep.Outcome
		final bool
	}{
		{nil, stripestep.Succeeded, true},
		{fmt.Errorf("stripe confirm: %w", refusal{declined: true}), stripestep.Failed, true},
		{fmt.Errorf("stripe confirm: %w", refusal{}), stripestep.Rejected, true},
		{fmt.Errorf("refund: %w: no key", stripestep.ErrRejected), stripestep.Rejected, true},
		{fmt.Errorf("stripe create: %w: 500", stripestep.ErrIndeterminate), stripestep.Indeterminate, true},
		{fmt.Errorf("stripe create: %w: 401", stripestep.ErrCredentials), stripestep.Open, true},
		{fmt.Errorf("stripe create after 5 attempts: %w: 429", stripestep.ErrUnanswered), stripestep.Open, false},
		{context.DeadlineExceeded, stripestep.Open, false},
		{errors.New("connection reset"), stripestep.Open, false},
	} {
		require.Equal(t, c.want, stripestep.OutcomeOf(c.err), "%v", c.err)
		require.Equal(t, c.final, stripestep.Final(c.err), "%v", c.err)
	}
	require.True(t, stripestep.Failed.Refused())
	require.True(t, stripestep.Rejected.Refused())
	require.False(t, stripestep.Indeterminate.Refused())
}
