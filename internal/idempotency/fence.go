package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
)

// Fence is the lease check behind every write a route makes while it holds
// a key: the write happens only while the key of Scope still names Owner
// as its lease owner, so a run whose lease expired and was taken over can
// never write after the new owner. It names the key by its scope, as
// Extend and Release do: the lease is (scope, owner), and a statement that
// claimed the key need not read its id back to fence the next. The zero Fence (no key: the reconciler, a
// webhook) fences nothing.
//
// It is the one place the lease column is read outside Store's own
// statements. A route uses it two ways: Store.Fence first inside a
// transaction (it locks the key), or Queue first in a batch
// (postgres.Batch) of the writes it fences (it checks without a lock).
//
// Lock order. Every transaction that holds a key and writes its order
// locks the key first and the order after it: Store.Fence (or a batch's
// first fenced write of the key, Store.QueueFinish) before any statement
// that locks the order's row. A takeover locks the key and then writes
// the order, so a transaction that locked the order first and then waited
// for the key could deadlock against it. checkout's phases keep this
// order (checkout's TestSettleLocksTheKeyBeforeTheOrder holds a key locked
// and fails if the settlement has locked the order meanwhile).
type Fence struct {
	// Scope is the key's tenant, route and key.
	Scope Scope
	// Owner is the lease token the writes are made under; "" fences
	// nothing.
	Owner string
}

// Fence returns the fence of c's lease; the zero Fence for a nil c.
func (c *Claim) Fence() Fence {
	if c == nil {
		return Fence{}
	}
	return Fence{Scope: c.Scope, Owner: c.Owner}
}

// lock is the SELECT, with its arguments, that locks f's key (FOR UPDATE)
// and returns its id while f's owner holds it unfinished, and no row
// otherwise: the first statement of a transaction whose writes must not
// overlap a takeover, which waits for it or sees it.
func (f Fence) lock() (string, []any) {
	return `SELECT id FROM idempotency_keys
		WHERE tenant_id = ? AND route = ? AND key = ? AND lease_owner = ? AND recovery_point <> ? FOR UPDATE`,
		[]any{f.Scope.Tenant, f.Scope.Route, f.Scope.Key, f.Owner, RecoveryPointFinished}
}

// Queue queues f's check in b, to come before the writes it fences: the
// batch fails with GuardLeaseLost (and nothing of it is written) unless
// f's owner still holds the key, unfinished. The zero Fence queues
// nothing.
//
// It does not lock the key (Store.Fence does, in a transaction): a
// takeover that commits after the check goes unseen by the rest of the
// batch, which is enough for writes the next fenced step checks again (an
// attempt written before its Stripe call: a takeover's run writing the
// same attempt finds it taken). A batch whose writes must not overlap a
// takeover ends with a fenced write of the key itself (Store.QueueFinish),
// which locks it and fails the whole batch after a takeover.
func (f Fence) Queue(b *postgres.Batch) {
	if f.Owner == "" {
		return
	}
	b.QueueGuarded(GuardLeaseLost, `SELECT 1 FROM idempotency_keys
		WHERE tenant_id = ? AND route = ? AND key = ? AND lease_owner = ? AND recovery_point <> ?`,
		[]any{f.Scope.Tenant, f.Scope.Route, f.Scope.Key, f.Owner, RecoveryPointFinished}, nil)
}

// Fence locks c's key inside tx and checks that c still holds it,
// unfinished: ErrLeaseLost when another owner took it over (or it was
// finished), and the caller must roll back. Called first in a transaction,
// it orders every later write after any takeover.
func (s *Store) Fence(ctx context.Context, tx *gorm.DB, c *Claim) error {
	query, args := c.Fence().lock()
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
