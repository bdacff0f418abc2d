package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/testenv"
)

func TestValidateKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		key  string
		want error
	}{
		{"empty is missing", "", idempotency.ErrKeyMissing},
		{"uuid is valid", "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"255 characters is valid", strings.Repeat("k", 255), nil},
		{"256 characters is invalid", strings.Repeat("k", 256), idempotency.ErrKeyInvalid},
		{"inner space is valid", "order 42", nil},
		{"tab is invalid", "a\tb", idempotency.ErrKeyInvalid},
		{"DEL is invalid", "a\x7fb", idempotency.ErrKeyInvalid},
		{"UTF-8 is invalid", "clé", idempotency.ErrKeyInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, idempotency.ValidateKey(tc.key))
		})
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(method, route, body string) string {
		t.Helper()
		s, err := idempotency.Fingerprint(method, route, []byte(body))
		require.NoError(t, err)
		return s
	}
	base := fp("POST", "POST /v1/checkouts", `{"a":1,"b":[1,2],"c":{"x":"y"}}`)
	require.Len(t, base, 64)
	require.Equal(t, base, fp("POST", "POST /v1/checkouts", "{ \"c\" : {\"x\":\"y\"},\n\"b\":[1, 2], \"a\":1.0 }"), "RFC 8785: order, whitespace and number form do not matter")
	require.NotEqual(t, base, fp("POST", "POST /v1/checkouts", `{"a":1,"b":[2,1],"c":{"x":"y"}}`), "array order matters")
	require.NotEqual(t, base, fp("POST", "POST /v1/other", `{"a":1,"b":[1,2],"c":{"x":"y"}}`), "the route is part of it")
	require.NotEqual(t, base, fp("PUT", "POST /v1/checkouts", `{"a":1,"b":[1,2],"c":{"x":"y"}}`), "the method is part of it")
	for _, bad := range []string{``, `{`, `{"a":1,"a":2}`, `{"a":01}`} {
		_, err := idempotency.Fingerprint("POST", "POST /v1/checkouts", []byte(bad))
		require.Equal(t, "malformed_json", problem.From(err).Code, "%q", bad)
		require.Contains(t, problem.From(err).Detail, "not valid JSON: ", "the parser's reason is given")
	}
}

func TestScopeHash(t *testing.T) {
	t.Parallel()
	a := idempotency.Scope{Tenant: "acme", Route: "POST /v1/checkouts", Key: "k"}
	require.NotEqual(t, a.Hash(), idempotency.Scope{Tenant: "globex", Route: a.Route, Key: a.Key}.Hash())
	require.NotEqual(t, a.Hash(), idempotency.Scope{Tenant: a.Tenant, Route: "POST /v1/other", Key: a.Key}.Hash())
	// The separator keeps ("ab","c") and ("a","bc") apart.
	require.NotEqual(t,
		idempotency.Scope{Tenant: "ab", Route: "r", Key: "c"}.Hash(),
		idempotency.Scope{Tenant: "a", Route: "b", Key: "rc"}.Hash())
	require.NotContains(t, a.Hash(), "k")
}

func newStore() *idempotency.Store {
	return &idempotency.Store{Lease: 30 * time.Second, TTL: 24 * time.Hour, Now: time.Now}
}

var scope = idempotency.Scope{Tenant: "acme", Route: "POST /v1/checkouts", Key: "key-1"}

func claim(t testing.TB, db *gorm.DB, s *idempotency.Store, sc idempotency.Scope, fp, owner string, commit bool) (*idempotency.Claim, error) {
	t.Helper()
	var c *idempotency.Claim
	errRollback := errors.New("rollback")
	err := postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
		var err error
		c, err = s.Claim(context.Background(), tx, sc, fp, owner)
		if err != nil {
			return err
		}
		if c.New {
			if err := s.Advance(context.Background(), tx, c, "order_created", "ord_1"); err != nil {
				return err
			}
		}
		if !commit {
			return errRollback
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	return c, err
}

// TestClaimSequential walks one key through the store's rules.
func TestClaimSequential(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	s := newStore()

	c, err := claim(t, db, s, scope, "fp", "owner-1", true)
	require.NoError(t, err)
	require.True(t, c.New)

	_, err = claim(t, db, s, scope, "fp", "owner-2", true)
	require.ErrorIs(t, err, idempotency.ErrKeyInUse, "the lease is live")

	_, err = claim(t, db, s, scope, "other-fp", "owner-2", true)
	require.ErrorIs(t, err, idempotency.ErrKeyReused, "the fingerprint is checked first")

	other := scope
	other.Tenant = "globex"
	c2, err := claim(t, db, s, other, "fp", "owner-3", true)
	require.NoError(t, err)
	require.True(t, c2.New, "another tenant's key is another scope")

	// Finish with the first owner; a stale owner cannot.
	resp := idempotency.JSONResponse(201, []byte(`{"id":"ord_1"}`), "/v1/orders/ord_1")
	err = postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
		return s.Finish(context.Background(), tx, &idempotency.Claim{ID: c.ID, Scope: c.Scope, Owner: "stale"}, resp)
	})
	require.ErrorIs(t, err, idempotency.ErrLeaseLost)
	err = postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
		return s.Finish(context.Background(), tx, c, resp)
	})
	require.NoError(t, err)

	replay, err := claim(t, db, s, scope, "fp", "owner-4", true)
	require.NoError(t, err)
	require.False(t, replay.New)
	require.NotNil(t, replay.Response)
	require.Equal(t, 201, replay.Response.Status)
	require.Equal(t, `{"id":"ord_1"}`, string(replay.Response.Body))
	require.Equal(t, "/v1/orders/ord_1", replay.Response.Header["Location"])
}

// TestClaimRolledBack: a claim whose transaction rolls back leaves nothing.
func TestClaimRolledBack(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	s := newStore()
	c, err := claim(t, db, s, scope, "fp", "owner-1", false)
	require.NoError(t, err)
	require.True(t, c.New)
	c, err = claim(t, db, s, scope, "fp", "owner-2", true)
	require.NoError(t, err)
	require.True(t, c.New, "the rolled-back claim left no row")
}

// TestClaimConcurrent: 20 claims of one key at once have exactly one winner;
// the others load the existing row (ON CONFLICT DO NOTHING returns no row,
// which must not be mistaken for an error or for a new claim).
func TestClaimConcurrent(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t, pgtest.Options{MaxConns: 25})
	s := newStore()
	for round := range 5 {
		sc := scope
		sc.Key = "concurrent-" + testenv.Random(4)
		var (
			wg              sync.WaitGroup
			mu              sync.Mutex
			winners, inUses int
		)
		start := make(chan struct{})
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				c, err := claim(t, db, s, sc, "fp", "owner-"+string(rune('a'+i)), true)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && c.New:
					winners++
				case errors.Is(err, idempotency.ErrKeyInUse):
					inUses++
				default:
					t.Errorf("round %d: unexpected claim result %+v, %v", round, c, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Equal(t, 1, winners, "round %d", round)
		require.Equal(t, 19, inUses, "round %d", round)
	}
}

// TestClaimTakeover: an expired lease is taken over and the old owner is
// fenced out.
func TestClaimTakeover(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	now := time.Now()
	s := &idempotency.Store{Lease: time.Minute, TTL: time.Hour, Now: func() time.Time { return now }}
	first, err := claim(t, db, s, scope, "fp", "owner-1", true)
	require.NoError(t, err)

	now = now.Add(2 * time.Minute)
	second, err := claim(t, db, s, scope, "fp", "owner-2", true)
	require.NoError(t, err)
	require.True(t, second.TakenOver)
	require.Equal(t, "order_created", second.RecoveryPoint)
	require.Equal(t, "ord_1", second.OrderID)

	err = postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
		return s.Finish(context.Background(), tx, first, idempotency.JSONResponse(201, []byte(`{}`), ""))
	})
	require.ErrorIs(t, err, idempotency.ErrLeaseLost, "the old owner may not write")
	ok, err := s.Extend(context.Background(), db, scope, "owner-1")
	require.NoError(t, err)
	require.False(t, ok, "nor extend")
	ok, err = s.Extend(context.Background(), db, scope, "owner-2")
	require.NoError(t, err)
	require.True(t, ok)

	// TTL: a finished key past its retention is claimed as new.
	require.NoError(t, postgres.WithTx(context.Background(), db, func(tx *gorm.DB) error {
		return s.Finish(context.Background(), tx, second, idempotency.JSONResponse(201, []byte(`{}`), ""))
	}))
	now = now.Add(2 * time.Hour)
	third, err := claim(t, db, s, scope, "other-fp", "owner-3", true)
	require.NoError(t, err)
	require.True(t, third.New)
}

// TestLeasesSettle: the end of a request in one round trip caches the
// response and releases the lease, but only the caller's lease: a lease
// another owner took meanwhile stays, and an already expired response is
// not cached.
func TestLeasesSettle(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	l := idempotency.NewLeases(rdb, prefix)
	ctx := context.Background()
	leaseKey := prefix + "idem:{" + scope.Hash() + "}:lease"

	a, err := l.Acquire(ctx, scope, "fp", "owner-1", time.Minute)
	require.NoError(t, err)
	require.True(t, a.Acquired)
	expired := idempotency.JSONResponse(201, []byte(`{"old":true}`), "/x")
	expired.ExpiresAt = time.Now().Add(-time.Second)
	released, err := l.Settle(ctx, scope, "fp", "owner-2", expired, time.Now())
	require.NoError(t, err)
	require.False(t, released, "owner-2 cannot release owner-1's lease")
	require.Equal(t, int64(1), rdb.Exists(ctx, leaseKey).Val())
	b, err := l.Acquire(ctx, scope, "fp", "owner-3", time.Minute)
	require.NoError(t, err)
	require.Nil(t, b.Cached, "an expired response is not cached")
	require.False(t, b.Acquired)

	resp := idempotency.JSONResponse(201, []byte(`{"ok":true}`), "/x")
	resp.ExpiresAt = time.Now().Add(time.Hour)
	released, err = l.Settle(ctx, scope, "fp", "owner-1", resp, time.Now())
	require.NoError(t, err)
	require.True(t, released)
	require.Zero(t, rdb.Exists(ctx, leaseKey).Val(), "the lease is gone")
	c, err := l.Acquire(ctx, scope, "fp", "owner-4", time.Minute)
	require.NoError(t, err)
	require.False(t, c.Acquired)
	require.Equal(t, resp.Body, c.Cached.Body, "the response is replayed from the cache")
	ttl := rdb.PTTL(ctx, prefix+"idem:{"+scope.Hash()+"}:resp").Val()
	require.Greater(t, ttl, 59*time.Minute, "kept until the key's expiry")
}

// TestLeases: SET NX PX with an owner token; extend and release only by
// compare-and-set, so one owner never touches another's lease.
func TestLeases(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	l := idempotency.NewLeases(rdb, prefix)
	ctx := context.Background()

	a, err := l.Acquire(ctx, scope, "fp", "owner-1", time.Second)
	require.NoError(t, err)
	require.True(t, a.Acquired)

	b, err := l.Acquire(ctx, scope, "fp", "owner-2", time.Second)
	require.NoError(t, err)
	require.False(t, b.Acquired)
	require.Equal(t, "fp", b.HolderFingerprint)

	ok, err := l.Release(ctx, scope, "fp", "owner-2")
	require.NoError(t, err)
	require.False(t, ok, "owner-2 cannot release owner-1's lease")
	ok, err = l.Extend(ctx, scope, "fp", "owner-2", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "nor extend it")

	ok, err = l.Extend(ctx, scope, "fp", "owner-1", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	ttl := rdb.PTTL(ctx, prefix+"idem:{"+scope.Hash()+"}:lease").Val()
	require.Greater(t, ttl, 50*time.Second)

	ok, err = l.Release(ctx, scope, "fp", "owner-1")
	require.NoError(t, err)
	require.True(t, ok)

	c, err := l.Acquire(ctx, scope, "fp", "owner-3", 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, c.Acquired)
	require.Eventually(t, func() bool {
		d, err := l.Acquire(ctx, scope, "fp", "owner-4", time.Second)
		return err == nil && d.Acquired
	}, 5*time.Second, 20*time.Millisecond, "an expired lease can be taken")

	// A cached response is returned before any lease.
	resp := idempotency.JSONResponse(201, []byte(`{"ok":true}`), "/x")
	resp.ExpiresAt = time.Now().Add(time.Hour)
	require.NoError(t, l.Cache(ctx, scope, "fp", resp, time.Now()))
	e, err := l.Acquire(ctx, scope, "fp", "owner-5", time.Second)
	require.NoError(t, err)
	require.False(t, e.Acquired)
	require.Equal(t, "fp", e.CachedFingerprint)
	require.Equal(t, resp.Body, e.Cached.Body)
	require.Equal(t, "/x", e.Cached.Header["Location"])

	// Every key written starts with the prefix.
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
}

// TestLeasesRedisDown: an unreachable Redis is an error, never a lease.
func TestLeasesRedisDown(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	client := redisClient(t, rs.URL())
	l := idempotency.NewLeases(client, "test:")
	rs.Stop()
	_, err := l.Acquire(context.Background(), scope, "fp", "owner", time.Second)
	require.Error(t, err)
}

// TestLeasesCorruptCache: a cached response that does not decode is
// treated as absent (deleted, and the lease taken), never as Redis failing,
// which would answer 503 for the key until the entry expired.
func TestLeasesCorruptCache(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	l := idempotency.NewLeases(rdb, prefix)
	ctx := context.Background()
	respKey := prefix + "idem:{" + scope.Hash() + "}:resp"
	for _, junk := range []string{"{not json", `{"fingerprint":"fp"}`, "null"} {
		require.NoError(t, rdb.Set(ctx, respKey, junk, time.Hour).Err())
		a, err := l.Acquire(ctx, scope, "fp", "owner-"+junk, time.Second)
		require.NoError(t, err, "%q", junk)
		require.True(t, a.Acquired, "%q: the lease is taken; Postgres answers", junk)
		require.Nil(t, a.Cached)
		require.Zero(t, rdb.Exists(ctx, respKey).Val(), "%q: the corrupt entry is gone", junk)
		_, err = l.Release(ctx, scope, "fp", "owner-"+junk)
		require.NoError(t, err)
	}
}
