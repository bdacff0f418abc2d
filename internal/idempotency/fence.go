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
// transaction, or Queue first in a batch (postgres.Batch) of the writes it
// fences; both lock the key and check it, in one round trip.
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
// otherwise: the first statement of a transaction or batch whose writes
// must not overlap a takeover, which waits for it or sees it.
func (f Fence) lock() (string, []any) {
	return `SELECT id FROM idempotency_keys
		WHERE tenant_id = ? AND route = ? AND key = ? AND lease_owner = ? AND recovery_point <> ? FOR UPDATE`,
		[]any{f.Scope.Tenant, f.Scope.Route, f.Scope.Key, f.Owner, RecoveryPointFinished}
}

// Queue queues f's check in b, to come before the writes it fences: it
// locks the key and fails the batch with GuardLeaseLost (and nothing of it
// is written) unless f's owner still holds it, unfinished. The zero Fence
// queues nothing.
func (f Fence) Queue(b *postgres.Batch) {
	if f.Owner == "" {
		return
	}
	query, args := f.lock()
	b.QueueGuarded(GuardLeaseLost, query, args, nil)
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
