package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// Fence is the lease check behind every write a route makes while it holds
// a key: the write happens only while key ID still names Owner as its
// lease owner, so a run whose lease expired and was taken over can never
// write after the new owner. The zero Fence (no key: the reconciler, a
// webhook) fences nothing.
//
// It is the one place the lease column is read outside Store's own
// statements. A route uses it three ways: Store.Fence inside a
// transaction (lock and check, one round trip), Holds as the condition of
// a single statement (an INSERT ... SELECT ... WHERE), or Lock as a
// data-modifying CTE that must see the key locked before it writes.
type Fence struct {
	// ID is the key's id (idempotency_keys.id); 0 fences nothing.
	ID int64
	// Owner is the lease token the writes are made under.
	Owner string
}

// Fence returns the fence of c's lease; the zero Fence for a nil c.
func (c *Claim) Fence() Fence {
	if c == nil {
		return Fence{}
	}
	return Fence{ID: c.ID, Owner: c.Owner}
}

// Holds returns a boolean SQL expression, with its arguments, that is
// true while f's key is still held by f's owner ("TRUE" for the zero
// Fence). It does not lock the key: a takeover that commits after the
// statement's snapshot goes unseen, which is enough for a write the next
// fenced step checks again (an attempt written before its Stripe call).
func (f Fence) Holds() (string, []any) {
	if f.ID == 0 {
		return "TRUE", nil
	}
	return `EXISTS (SELECT 1 FROM idempotency_keys WHERE id = ? AND lease_owner = ?)`, []any{f.ID, f.Owner}
}

// Lock returns a SELECT, with its arguments, that locks f's key (FOR
// UPDATE) and returns its id while f's owner holds it unfinished, and no
// row otherwise: the first step of a statement whose writes must not
// overlap a takeover. f must not be the zero Fence.
func (f Fence) Lock() (string, []any) {
	return `SELECT id FROM idempotency_keys WHERE id = ? AND lease_owner = ? AND recovery_point <> ? FOR UPDATE`,
		[]any{f.ID, f.Owner, RecoveryPointFinished}
}

// Fence locks c's key inside tx and checks that c still holds it,
// unfinished: ErrLeaseLost when another owner took it over (or it was
// finished), and the caller must roll back. Called first in a transaction,
// it orders every later write after any takeover.
func (s *Store) Fence(ctx context.Context, tx *gorm.DB, c *Claim) error {
	query, args := c.Fence().Lock()
	var id int64
	err := tx.WithContext(ctx).Raw(query, args...).Row().Scan(&id) // Row: see Claim
	if errors.Is(err, sql.ErrNoRows) {
		return ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("fence key %d: %w", c.ID, err)
	}
	return nil
}
