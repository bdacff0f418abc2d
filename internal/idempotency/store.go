package idempotency

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/problem"
)

// Recovery points every route shares. Routes add their own in between (the
// checkout adds "order_created"); Store treats those as opaque.
const (
	// RecoveryPointStarted is a claim made in the current transaction whose
	// first phase has not committed yet. It is never seen committed unless a
	// route commits without advancing.
	RecoveryPointStarted = "started"
	// RecoveryPointFinished means the response is stored and is replayed.
	RecoveryPointFinished = "finished"
)

// ErrLeaseLost is returned by the fenced writes when another owner has taken
// the key over (its lease expired while this request ran). The caller must
// roll back: the new owner finishes the request. Clients see it as 409.
var ErrLeaseLost = problem.New(problem.CodeIdempotencyKeyInUse,
	"Another attempt took over this request. Retry later with the same key to get its response.")

// Store is the Postgres layer, the authority on every key. Its methods take
// the transaction explicitly so that the claim, the route's state change and
// its outbox events commit or roll back together.
type Store struct {
	// Lease is how long a claim stays exclusive without extension
	// (IDEMPOTENCY_LEASE).
	Lease time.Duration
	// TTL is how long a finished key is kept (IDEMPOTENCY_TTL), counted
	// from its final answer (Finish): after it the key may be used as new.
	// An unfinished key has no end of retention (its expires_at is NULL):
	// it never expires and is never reaped, however long it takes to
	// finish (CONTRACT.md, Retention).
	TTL time.Duration
	// Now is the clock; lease and TTL comparisons use it, not the
	// database's, so tests can move time.
	Now func() time.Time
	// Metrics counts takeovers; nil counts nothing.
	Metrics *Metrics
}

// Claim is a key held by one owner, as loaded or created by Store.Claim.
type Claim struct {
	ID            int64
	Scope         Scope
	Fingerprint   string
	RecoveryPoint string
	// OrderID is what the route recorded with its recovery point.
	OrderID string
	// Owner is the lease token this process writes with; fenced writes
	// succeed only while the row still names it.
	Owner string
	// New is true when this claim inserted the row.
	New bool
	// TakenOver is true when this claim took over an expired lease: the
	// route resumes at RecoveryPoint.
	TakenOver bool
	// Response is set when the key is finished: replay it, run nothing.
	Response *Response
}

type keyRow struct {
	ID              int64
	TenantID        string
	Route           string
	Key             string
	Fingerprint     string
	RecoveryPoint   string
	OrderID         *string
	LeaseOwner      *string
	LeaseExpiresAt  *time.Time
	ResponseStatus  *int
	ResponseHeaders []byte
	ResponseBody    []byte
	CreatedAt       time.Time
	UpdatedAt       time.Time
	FinishedAt      *time.Time
	// ExpiresAt is the end of a finished key's retention; NULL while the
	// key is unfinished.
	ExpiresAt *time.Time
}

func (keyRow) TableName() string { return "idempotency_keys" }

// Claim claims scope for owner inside tx: the first step of the route's
// first transaction.
//
// A new key is inserted at RecoveryPointStarted with a lease of s.Lease. For
// an existing key the row is locked and, in this order: another fingerprint
// returns ErrKeyReused; a finished key returns a Claim whose Response is set
// (replay it); a live lease returns ErrKeyInUse; an expired lease is taken
// over (Claim.TakenOver) and the route resumes at its recovery point. A
// finished key whose retention has ended (s.TTL after it finished) is
// deleted and claimed as new; an unfinished key never expires, however old.
//
// Commit makes the claim visible to every other request; rollback forgets
// it, as if the request had never come. A concurrent Claim of the same scope
// waits for this transaction to end.
func (s *Store) Claim(ctx context.Context, tx *gorm.DB, scope Scope, fingerprint, owner string) (*Claim, error) {
	tx = tx.WithContext(ctx)
	// Two rounds at most: the second follows the deletion of an expired key,
	// or a row deleted by the reaper between the insert and the select.
	for range 3 {
		now := s.Now()
		// Row, not Scan: GORM's Scan renders the statement with its values
		// inlined for a logger, on every checkout.
		var id int64
		err := tx.Raw(`
			INSERT INTO idempotency_keys
			  (tenant_id, route, key, fingerprint, recovery_point, lease_owner, lease_expires_at, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (tenant_id, route, key) DO NOTHING
			RETURNING id`,
			scope.Tenant, scope.Route, scope.Key, fingerprint, RecoveryPointStarted,
			owner, now.Add(s.Lease), now, now).Row().Scan(&id)
		// ON CONFLICT DO NOTHING is not an error: it returns no row.
		if err == nil {
			return &Claim{ID: id, Scope: scope, Fingerprint: fingerprint,
				RecoveryPoint: RecoveryPointStarted, Owner: owner, New: true}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("claim key: %w", err)
		}

		var row keyRow
		err = tx.Clauses(clause.Locking{Strength: "UPDATE"}).
			Where("tenant_id = ? AND route = ? AND key = ?", scope.Tenant, scope.Route, scope.Key).
			Take(&row).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			continue // deleted since the insert; try again
		}
		if err != nil {
			return nil, fmt.Errorf("load key: %w", err)
		}
		if row.expired(now) {
			if err := tx.Exec(`DELETE FROM idempotency_keys WHERE id = ?`, row.ID).Error; err != nil {
				return nil, fmt.Errorf("delete expired key: %w", err)
			}
			continue
		}
		return s.claimExisting(tx, &row, fingerprint, owner, now)
	}
	return nil, fmt.Errorf("claim key: the row kept changing")
}

// claimExisting applies the rules for a locked existing row.
func (s *Store) claimExisting(tx *gorm.DB, row *keyRow, fingerprint, owner string, now time.Time) (*Claim, error) {
	if row.Fingerprint != fingerprint {
		return nil, ErrKeyReused
	}
	c := claimOf(row)
	if row.RecoveryPoint == RecoveryPointFinished {
		resp, err := row.response()
		if err != nil {
			return nil, err
		}
		c.Response = resp
		return c, nil
	}
	if row.LeaseExpiresAt != nil && row.LeaseExpiresAt.After(now) {
		return nil, ErrKeyInUse
	}
	err := tx.Exec(`UPDATE idempotency_keys SET lease_owner = ?, lease_expires_at = ?, updated_at = ? WHERE id = ?`,
		owner, now.Add(s.Lease), now, row.ID).Error
	if err != nil {
		return nil, fmt.Errorf("take over key: %w", err)
	}
	c.Owner = owner
	c.TakenOver = true
	s.Metrics.TakenOver()
	return c, nil
}

// expired reports whether row's retention has ended at now: only a
// finished key has an end (expires_at, set by Finish); an unfinished key
// never expires.
func (row *keyRow) expired(now time.Time) bool {
	return row.RecoveryPoint == RecoveryPointFinished && row.ExpiresAt != nil && !row.ExpiresAt.After(now)
}

func claimOf(row *keyRow) *Claim {
	c := &Claim{
		ID:            row.ID,
		Scope:         Scope{Tenant: row.TenantID, Route: row.Route, Key: row.Key},
		Fingerprint:   row.Fingerprint,
		RecoveryPoint: row.RecoveryPoint,
	}
	if row.OrderID != nil {
		c.OrderID = *row.OrderID
	}
	if row.LeaseOwner != nil {
		c.Owner = *row.LeaseOwner
	}
	return c
}

func (row *keyRow) response() (*Response, error) {
	if row.ResponseStatus == nil || row.ExpiresAt == nil {
		return nil, fmt.Errorf("key %d is finished without a response or its end of retention", row.ID)
	}
	r := &Response{Status: *row.ResponseStatus, Body: row.ResponseBody, ExpiresAt: *row.ExpiresAt}
	if len(row.ResponseHeaders) > 0 {
		if err := json.Unmarshal(row.ResponseHeaders, &r.Header); err != nil {
			return nil, fmt.Errorf("key %d: decode stored headers: %w", row.ID, err)
		}
	}
	return r, nil
}

// TakeOver claims the unfinished key id for owner if its lease has expired
// and its route is one of routes, skipping a row another transaction has
// locked. It returns (nil, nil), having changed nothing, when there is
// nothing to take over: the key is finished, its lease is live, someone
// else is on it, or it belongs to another route (whose state machine the
// caller does not run). The completer uses it.
func (s *Store) TakeOver(ctx context.Context, tx *gorm.DB, id int64, owner string, routes ...string) (*Claim, error) {
	if len(routes) == 0 {
		return nil, errors.New("take over key: no route given")
	}
	var row keyRow
	err := tx.WithContext(ctx).Clauses(clause.Locking{Strength: "UPDATE", Options: "SKIP LOCKED"}).
		Where("id = ? AND route IN ?", id, routes).Take(&row).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load key %d: %w", id, err)
	}
	now := s.Now()
	if row.RecoveryPoint == RecoveryPointFinished || (row.LeaseExpiresAt != nil && row.LeaseExpiresAt.After(now)) {
		return nil, nil
	}
	return s.claimExisting(tx.WithContext(ctx), &row, row.Fingerprint, owner, now)
}

// Expired lists up to limit unfinished keys whose lease ended before
// olderThan, oldest first: the completer's work.
func (s *Store) Expired(ctx context.Context, db *gorm.DB, olderThan time.Time, limit int) ([]int64, error) {
	var ids []int64
	err := db.WithContext(ctx).Raw(`
		SELECT id FROM idempotency_keys
		WHERE recovery_point <> ? AND lease_expires_at < ?
		ORDER BY lease_expires_at LIMIT ?`, RecoveryPointFinished, olderThan, limit).Scan(&ids).Error
	if err != nil {
		return nil, fmt.Errorf("list expired keys: %w", err)
	}
	return ids, nil
}

// ExpiredKey is an unfinished key that names an order, as ExpiredOrders
// lists it: the key's id, the order's tenant and id, and when the key's
// lease ended. The last one of a page is the cursor of the next.
type ExpiredKey struct {
	ID             int64
	TenantID       string
	OrderID        string
	LeaseExpiresAt time.Time
}

// ExpiredOrders lists up to limit unfinished keys that name an order and
// whose lease ended before olderThan, oldest lease first (ties by id),
// starting after the key after (the zero ExpiredKey: from the first). It
// pages through what Expired lists, with the keys' orders, for a caller
// that picks among them by the order's state (the reconciler), so that the
// keys it leaves never hide the ones after them. It reads the partial
// index idempotency_keys_unfinished.
func ExpiredOrders(ctx context.Context, db *gorm.DB, olderThan time.Time, after ExpiredKey, limit int) ([]ExpiredKey, error) {
	var keys []ExpiredKey
	err := db.WithContext(ctx).Raw(`
		SELECT id, tenant_id, order_id, lease_expires_at FROM idempotency_keys
		WHERE recovery_point <> ? AND lease_expires_at < ? AND order_id IS NOT NULL
		  AND lease_expires_at >= ? AND (lease_expires_at > ? OR id > ?)
		ORDER BY lease_expires_at, id LIMIT ?`,
		RecoveryPointFinished, olderThan, after.LeaseExpiresAt, after.LeaseExpiresAt, after.ID, limit).Scan(&keys).Error
	if err != nil {
		return nil, fmt.Errorf("list expired keys of orders: %w", err)
	}
	return keys, nil
}

// OrderTaken reports whether a key of c's tenant and route other than c
// has recorded orderID with its recovery point (Advance): another
// execution of the route, under another key, got to that order first.
// Inside the transaction that locked the order, the answer holds until
// commit.
func (s *Store) OrderTaken(ctx context.Context, tx *gorm.DB, c *Claim, orderID string) (bool, error) {
	var n int64
	err := tx.WithContext(ctx).Raw(`SELECT count(*) FROM idempotency_keys
		WHERE order_id = ? AND tenant_id = ? AND route = ? AND id <> ?`,
		orderID, c.Scope.Tenant, c.Scope.Route, c.ID).Row().Scan(&n)
	if err != nil {
		return false, fmt.Errorf("look for other keys of %s: %w", orderID, err)
	}
	return n > 0, nil
}

// CountExpired counts the unfinished keys whose lease ended before
// olderThan: what the completer could not finish yet.
func (s *Store) CountExpired(ctx context.Context, db *gorm.DB, olderThan time.Time) (int64, error) {
	var n int64
	err := db.WithContext(ctx).Raw(`
		SELECT count(*) FROM idempotency_keys
		WHERE recovery_point <> ? AND lease_expires_at < ?`, RecoveryPointFinished, olderThan).Row().Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count unfinished keys: %w", err)
	}
	return n, nil
}

// Reap deletes up to limit finished keys whose retention ended before
// now (expires_at: IDEMPOTENCY_TTL after the key finished), in one
// statement (its own transaction on db), and returns how many. Only
// finished keys are deleted (an unfinished key has no expires_at: it
// belongs to a retry or the completer), never one a transaction holds: rows are
// picked FOR UPDATE SKIP LOCKED, which rechecks the condition on the
// latest version of the row, so a reaper never waits for a request and
// several reapers share the work. The reaper (internal/sweep) calls it
// until a batch comes back short.
func Reap(ctx context.Context, db *gorm.DB, now time.Time, limit int) (int64, error) {
	// The constant is a literal in the SQL so that the planner matches the
	// partial index idempotency_keys_expires whatever the plan cache does.
	res := db.WithContext(ctx).Exec(`
		DELETE FROM idempotency_keys WHERE id = ANY(ARRAY(
		  SELECT id FROM idempotency_keys
		  WHERE recovery_point = '`+RecoveryPointFinished+`' AND expires_at < ?
		  ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED))`, now, limit)
	if res.Error != nil {
		return 0, fmt.Errorf("delete expired keys: %w", res.Error)
	}
	return res.RowsAffected, nil
}

// Advance records a recovery point (and the route's order id) inside tx. It
// is fenced: when the row no longer names c.Owner it returns ErrLeaseLost and
// the caller must roll back.
func (s *Store) Advance(ctx context.Context, tx *gorm.DB, c *Claim, point, orderID string) error {
	res := tx.WithContext(ctx).Exec(`UPDATE idempotency_keys SET recovery_point = ?, order_id = ?, updated_at = ?
		WHERE id = ? AND lease_owner = ? AND recovery_point <> ?`,
		point, orderID, s.Now(), c.ID, c.Owner, RecoveryPointFinished)
	if res.Error != nil {
		return fmt.Errorf("advance key to %s: %w", point, res.Error)
	}
	if res.RowsAffected != 1 {
		return ErrLeaseLost
	}
	c.Advanced(point, orderID)
	return nil
}

// QueueClaimNew queues in b the claim of scope as a new key for owner, at
// recovery point point with orderID and a lease of s.Lease: for a route
// whose first phase claims the key and writes its rows in one batch, so
// that the claim, the route's writes and its recovery point commit
// together in one round trip instead of a transaction of several. The
// returned Claim is the claim once b is sent without error (its ID is set
// then); after an error it means nothing.
//
// It has no ON CONFLICT: when the key exists, the batch fails with a unique
// violation (IsKeyTaken) and writes nothing, and the caller claims the key
// with Claim, which applies the rules for an existing key.
func (s *Store) QueueClaimNew(b *postgres.Batch, scope Scope, fingerprint, owner, point, orderID string) *Claim {
	now := s.Now()
	c := &Claim{Scope: scope, Fingerprint: fingerprint, RecoveryPoint: point, OrderID: orderID, Owner: owner, New: true}
	var id int64
	b.Queue(`INSERT INTO idempotency_keys
		  (tenant_id, route, key, fingerprint, recovery_point, order_id, lease_owner, lease_expires_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		RETURNING id`,
		[]any{scope.Tenant, scope.Route, scope.Key, fingerprint, point, orderID, owner, now.Add(s.Lease), now, now},
		func(r pgx.Row) error { return r.Scan(&id) })
	b.AfterCommit(func() { c.ID = id })
	return c
}

// IsKeyTaken reports whether err is the unique violation of a key that
// already exists, as QueueClaimNew's INSERT fails with.
func IsKeyTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" /* unique_violation */ && pgErr.TableName == "idempotency_keys"
}

// Advanced records on c that its key was advanced to point with orderID.
func (c *Claim) Advanced(point, orderID string) {
	c.RecoveryPoint, c.OrderID = point, orderID
}

// GuardLeaseLost is the batch guard (postgres.IsGuard) of a fenced
// statement whose key is no longer leased to the run, unfinished
// (QueueFinish, Fence.Queue): the batch wrote nothing, as ErrLeaseLost.
const GuardLeaseLost = "idempotency_lease_lost"

// finishStatement is Finish's fenced UPDATE and its arguments. It names the
// key by its scope, as Fence does. It is the one place a key's retention
// starts: expires_at is s.TTL after the final answer, however long the key
// took to get there.
func (s *Store) finishStatement(c *Claim, resp *Response) (string, []any, error) {
	headers, err := json.Marshal(resp.Header)
	if err != nil {
		return "", nil, err
	}
	now := s.Now()
	return `UPDATE idempotency_keys
		SET recovery_point = ?, response_status = ?, response_headers = ?, response_body = ?,
		    lease_owner = NULL, lease_expires_at = NULL, finished_at = ?, updated_at = ?, expires_at = ?
		WHERE tenant_id = ? AND route = ? AND key = ? AND lease_owner = ? AND recovery_point <> ?
		RETURNING expires_at`,
		[]any{RecoveryPointFinished, resp.Status, string(headers), resp.Body, now, now, now.Add(s.TTL),
			c.Scope.Tenant, c.Scope.Route, c.Scope.Key, c.Owner, RecoveryPointFinished}, nil
}

// QueueFinish queues in b what Finish does: resp stored as c's final
// response and its lease ended, fenced: while another owner holds the key
// (or it is finished) the batch fails with GuardLeaseLost. Once b commits,
// c is finished (Claim.Finished, resp.ExpiresAt set). Errors are those of
// encoding resp's headers; nothing was queued then.
func (s *Store) QueueFinish(b *postgres.Batch, c *Claim, resp *Response) error {
	query, args, err := s.finishStatement(c, resp)
	if err != nil {
		return err
	}
	var expiresAt time.Time
	b.QueueGuarded(GuardLeaseLost, query, args, func(r pgx.Row) error { return r.Scan(&expiresAt) })
	b.AfterCommit(func() { c.Finished(resp, expiresAt) })
	return nil
}

// Finished records on c that its key was finished with resp, kept until
// expiresAt.
func (c *Claim) Finished(resp *Response, expiresAt time.Time) {
	resp.ExpiresAt = expiresAt
	c.RecoveryPoint, c.Response = RecoveryPointFinished, resp
}

// Finish stores resp as the key's final response and ends its lease, inside
// tx. It is fenced like Advance. On return resp.ExpiresAt is the end of the
// key's retention: s.TTL from now, the final answer. Commit makes every
// later request with the key a replay until then.
func (s *Store) Finish(ctx context.Context, tx *gorm.DB, c *Claim, resp *Response) error {
	query, args, err := s.finishStatement(c, resp)
	if err != nil {
		return err
	}
	var expiresAt time.Time
	err = tx.WithContext(ctx).Raw(query, args...).Row().Scan(&expiresAt) // Row: see Claim
	if errors.Is(err, sql.ErrNoRows) {
		return ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("finish key: %w", err)
	}
	c.Finished(resp, expiresAt)
	return nil
}

// Extend pushes the lease of an unfinished key to s.Lease from now while
// owner holds it, and reports whether it did. It runs outside the route's
// transactions (on db), from the request's lease keeper.
func (s *Store) Extend(ctx context.Context, db *gorm.DB, scope Scope, owner string) (bool, error) {
	now := s.Now()
	res := db.WithContext(ctx).Exec(`
		UPDATE idempotency_keys SET lease_expires_at = ?, updated_at = ?
		WHERE tenant_id = ? AND route = ? AND key = ? AND lease_owner = ? AND recovery_point <> ?`,
		now.Add(s.Lease), now, scope.Tenant, scope.Route, scope.Key, owner, RecoveryPointFinished)
	if res.Error != nil {
		return false, fmt.Errorf("extend key lease: %w", res.Error)
	}
	return res.RowsAffected == 1, nil
}

// KeepLease extends the Postgres lease of scope held by owner every
// s.Lease/3 until the returned stop is called (stop waits for the keeper to
// end), so that a slow run (Stripe retrying) never loses its key to a
// takeover while it still works. The completer and the reconciler use it
// around a run, as the gateway does around a request.
func (s *Store) KeepLease(ctx context.Context, db *gorm.DB, scope Scope, owner string, logger *slog.Logger) (stop func()) {
	return keepAlive(ctx, s.Lease/3, func(ctx context.Context) { s.extend(ctx, db, scope, owner, logger) })
}

func (s *Store) extend(ctx context.Context, db *gorm.DB, scope Scope, owner string, logger *slog.Logger) {
	if ok, err := s.Extend(ctx, db, scope, owner); err != nil {
		logger.WarnContext(ctx, "extend postgres lease", "err", err)
	} else if ok {
		s.Metrics.extended("postgres")
	}
}

// Release ends the lease of an unfinished key now, keeping its recovery
// point, so that a retry can take it over at once instead of waiting for
// the lease to expire. It is a no-op when owner no longer holds it. It
// clears the owner too: the lease keeper's Extend, which may reach the row
// after Release (its tick is on another goroutine), then matches nothing,
// instead of moving the lease a whole IDEMPOTENCY_LEASE ahead. A
// Claim with no ID (only Scope and Owner) releases the key of that scope
// if this owner holds it: for a claim whose commit was lost.
func (s *Store) Release(ctx context.Context, db *gorm.DB, c *Claim) error {
	now := s.Now()
	var err error
	if c.ID == 0 {
		// A claim whose statement failed with its outcome unknown (the
		// connection lost at commit): it may have inserted the row, so the
		// row is found by its scope, and released only if it names this
		// owner.
		err = db.WithContext(ctx).Exec(`
			UPDATE idempotency_keys SET lease_owner = NULL, lease_expires_at = ?, updated_at = ?
			WHERE tenant_id = ? AND route = ? AND key = ? AND lease_owner = ? AND recovery_point <> ?`,
			now, now, c.Scope.Tenant, c.Scope.Route, c.Scope.Key, c.Owner, RecoveryPointFinished).Error
	} else {
		err = db.WithContext(ctx).Exec(`
			UPDATE idempotency_keys SET lease_owner = NULL, lease_expires_at = ?, updated_at = ?
			WHERE id = ? AND lease_owner = ? AND recovery_point <> ?`,
			now, now, c.ID, c.Owner, RecoveryPointFinished).Error
	}
	if err != nil {
		return fmt.Errorf("release key lease: %w", err)
	}
	return nil
}

// ReleaseEarly ends c's lease after a transient failure of the request that
// holds it, so that the client's retry resumes at once rather than after
// the lease expires. It returns at once; failures are logged to logger.
//
// When the database itself failed (a failover: the primary gone, its
// standby not promoted yet), the release fails too; it is then retried in
// the background with backoff (100ms to 1s) for up to one Lease, so the key
// resumes as soon as the new primary takes writes rather than a whole
// IDEMPOTENCY_LEASE later (TestFailoverToSynchronousStandby). Release is
// compare-and-set on the owner: a late one after a takeover changes
// nothing. A non-transient error (postgres.IsTransient) is not retried.
func (s *Store) ReleaseEarly(db *gorm.DB, c *Claim, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	err := s.Release(ctx, db, c)
	cancel()
	if err == nil {
		return
	}
	hash := c.Scope.Hash()[:16]
	if !postgres.IsTransient(err) || s.Lease <= 0 {
		logger.Warn("release key lease", "err", err, "key_hash", hash)
		return
	}
	logger.Warn("release key lease failed; retrying in the background", "err", err, "key_hash", hash)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.Lease)
		defer cancel()
		b := backoff.NewExponentialBackOff()
		b.InitialInterval, b.MaxInterval = 100*time.Millisecond, time.Second
		_, err := backoff.Retry(ctx, func() (struct{}, error) {
			attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			err := s.Release(attempt, db, c)
			if err != nil && !postgres.IsTransient(err) {
				return struct{}{}, backoff.Permanent(err)
			}
			return struct{}{}, err
		}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
		if err != nil {
			logger.Warn("release key lease: gave up; the lease expires by itself", "err", err, "key_hash", hash)
			return
		}
		logger.Info("key lease released after the database came back", "key_hash", hash)
	}()
}
