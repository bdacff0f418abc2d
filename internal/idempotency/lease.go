package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/checkout/internal/tracing"
)

// Leases is the Redis layer: a soft lease per scope, so that of many
// concurrent duplicates only one reaches Postgres, and a cache of finished
// responses, so that most replays never touch Postgres.
//
// Redis is an accelerator, not the authority: a lease lost to a flush or a
// failover can let a duplicate through to Postgres, whose key claim and
// fencing still allow only one execution.
//
// Keys, for prefix "checkout:" and scope hash h (Scope.Hash):
//
//	checkout:idem:{h}:lease  owner token + " " + fingerprint, PX = lease
//	checkout:idem:{h}:resp   the fingerprint and the response (encodeCached), PX = until the key's TTL ends
//
// The hash tag {h} keeps both in one Redis Cluster slot, so one script can
// read both.
type Leases struct {
	rdb    redis.UniversalClient
	prefix string
	// acquires batches the Acquire scripts of concurrent requests: every
	// request, replay or first execution, runs one.
	acquires *scriptBatcher
}

// NewLeases returns the Redis layer; every key it writes starts with prefix
// (REDIS_KEY_PREFIX).
func NewLeases(rdb redis.UniversalClient, prefix string) *Leases {
	return &Leases{rdb: rdb, prefix: prefix, acquires: &scriptBatcher{rdb: rdb, script: acquireScript}}
}

func (l *Leases) keys(s Scope) (lease, resp string) {
	base := l.prefix + "idem:{" + s.Hash() + "}:"
	return base + "lease", base + "resp"
}

// acquireScript is SET NX PX with the replay cache checked first, in one
// round trip. It returns {1, cached} for a finished response, {2} when the
// lease was taken, and {3, holder} when another owner holds it.
var acquireScript = redis.NewScript(`
local cached = redis.call('GET', KEYS[2])
if cached then return {1, cached} end
local prev = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'PX', ARGV[2])
if not prev then return {2, ''} end
return {3, prev}
`)

// extendScript and settleScript act on the lease only while the caller's token is still
// the value (compare-and-set), so a request whose lease expired can never
// extend or delete the lease a newer owner holds.
var (
	extendScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)
	// settleScript is Cache then Release in one round trip: the response
	// stored for replay (when its TTL, ARGV[3] ms, is positive), then the
	// lease deleted if it is still the caller's. Release alone is this
	// script with no response.
	settleScript = redis.NewScript(`
if tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)
)

// Acquisition is the result of Leases.Acquire.
type Acquisition struct {
	// Acquired is true when the caller now holds the lease.
	Acquired bool
	// Cached is a finished response found in the replay cache, and
	// CachedFingerprint the fingerprint of the request that produced it.
	Cached            *Response
	CachedFingerprint string
	// HolderFingerprint is the fingerprint of the request holding the lease
	// when Acquired is false and nothing was cached.
	HolderFingerprint string
}

type cachedResponse struct {
	Fingerprint string    `json:"fingerprint"`
	Response    *Response `json:"response"`
}

// cachedMagic starts the cache's own encoding of a cachedResponse: lines of
// fingerprint, status, expiry (Unix nanoseconds) and header count, a line
// per header name and value, then the body as it is. Every replay decodes
// one, and this takes a fraction of what JSON with a base64 body took.
// Entries written as JSON by earlier versions still decode.
const cachedMagic = "\x00idem2\n"

func encodeCached(fingerprint string, r *Response) []byte {
	b := make([]byte, 0, len(cachedMagic)+len(fingerprint)+64+len(r.Body))
	b = append(b, cachedMagic...)
	b = append(append(b, fingerprint...), '\n')
	b = append(strconv.AppendInt(b, int64(r.Status), 10), '\n')
	b = append(strconv.AppendInt(b, r.ExpiresAt.UnixNano(), 10), '\n')
	b = append(strconv.AppendInt(b, int64(len(r.Header)), 10), '\n')
	for k, v := range r.Header { // header names and values hold no newline
		b = append(append(b, k...), '\n')
		b = append(append(b, v...), '\n')
	}
	return append(b, r.Body...)
}

func decodeCached(v string) (cachedResponse, error) {
	var c cachedResponse
	if !strings.HasPrefix(v, cachedMagic) {
		if err := json.Unmarshal([]byte(v), &c); err != nil || c.Response == nil {
			return c, fmt.Errorf("not a cached response: %v", err)
		}
		return c, nil
	}
	rest := v[len(cachedMagic):]
	line := func() (string, bool) {
		i := strings.IndexByte(rest, '\n')
		if i < 0 {
			return "", false
		}
		l := rest[:i]
		rest = rest[i+1:]
		return l, true
	}
	fp, ok1 := line()
	status, ok2 := line()
	expires, ok3 := line()
	count, ok4 := line()
	st, err1 := strconv.Atoi(status)
	ns, err2 := strconv.ParseInt(expires, 10, 64)
	n, err3 := strconv.Atoi(count)
	if !ok1 || !ok2 || !ok3 || !ok4 || err1 != nil || err2 != nil || err3 != nil || n < 0 || n > 64 {
		return c, errors.New("truncated cached response")
	}
	r := &Response{Status: st, ExpiresAt: time.Unix(0, ns), Header: make(map[string]string, n)}
	for range n {
		k, ok1 := line()
		val, ok2 := line()
		if !ok1 || !ok2 {
			return c, errors.New("truncated cached response headers")
		}
		r.Header[k] = val
	}
	r.Body = []byte(rest)
	return cachedResponse{Fingerprint: fp, Response: r}, nil
}

func leaseValue(owner, fingerprint string) string { return owner + " " + fingerprint }

// Acquire returns the cached response of a finished key, or takes the lease
// for owner for ttl (SET NX PX), or reports who holds it. A cached entry
// that does not decode is treated as absent: it is deleted and the lease
// taken, so that Postgres, the authority, answers. An error means Redis did
// not answer; DEDUP_FAILURE_MODE decides what happens then.
//
// It is one span, idempotency.lease, over its Redis commands.
func (l *Leases) Acquire(ctx context.Context, s Scope, fingerprint, owner string, ttl time.Duration) (acq Acquisition, err error) {
	ctx, span := tracing.Start(ctx, "idempotency.lease")
	defer func() { tracing.End(span, err) }()
	acq, err = l.acquire(ctx, s, fingerprint, owner, ttl)
	if !errors.Is(err, errCorruptCache) {
		return acq, err
	}
	_, respKey := l.keys(s)
	if err := l.rdb.Del(ctx, respKey).Err(); err != nil {
		return Acquisition{}, fmt.Errorf("redis acquire: delete corrupt cached response: %w", err)
	}
	return l.acquire(ctx, s, fingerprint, owner, ttl)
}

// errCorruptCache is a cached response that does not decode.
var errCorruptCache = errors.New("corrupt cached response")

func (l *Leases) acquire(ctx context.Context, s Scope, fingerprint, owner string, ttl time.Duration) (Acquisition, error) {
	leaseKey, respKey := l.keys(s)
	res, err := l.acquires.run(ctx, []string{leaseKey, respKey},
		leaseValue(owner, fingerprint), ttl.Milliseconds()).Slice()
	if err != nil {
		return Acquisition{}, fmt.Errorf("redis acquire: %w", err)
	}
	if len(res) != 2 {
		return Acquisition{}, fmt.Errorf("redis acquire: unexpected reply %v", res)
	}
	code, _ := res[0].(int64)
	value, _ := res[1].(string)
	switch code {
	case 1:
		c, err := decodeCached(value)
		if err != nil {
			return Acquisition{}, fmt.Errorf("redis acquire: %w: %v", errCorruptCache, err)
		}
		return Acquisition{Cached: c.Response, CachedFingerprint: c.Fingerprint}, nil
	case 2:
		return Acquisition{Acquired: true}, nil
	case 3:
		_, fp, _ := strings.Cut(value, " ")
		return Acquisition{HolderFingerprint: fp}, nil
	}
	return Acquisition{}, fmt.Errorf("redis acquire: unexpected code %d", code)
}

// Extend pushes the lease's expiry to ttl from now if owner still holds it,
// and reports whether it did.
func (l *Leases) Extend(ctx context.Context, s Scope, fingerprint, owner string, ttl time.Duration) (bool, error) {
	leaseKey, _ := l.keys(s)
	n, err := extendScript.Run(ctx, l.rdb, []string{leaseKey}, leaseValue(owner, fingerprint), ttl.Milliseconds()).Int64()
	if err != nil {
		return false, fmt.Errorf("redis extend: %w", err)
	}
	return n == 1, nil
}

// Release deletes the lease if owner still holds it, and reports whether it
// did. Releasing a lease another owner holds is a no-op.
func (l *Leases) Release(ctx context.Context, s Scope, fingerprint, owner string) (bool, error) {
	return l.Settle(ctx, s, fingerprint, owner, nil, time.Time{})
}

// Cache stores a finished response for replay until resp.ExpiresAt. An
// already expired response is not stored.
func (l *Leases) Cache(ctx context.Context, s Scope, fingerprint string, resp *Response, now time.Time) error {
	ttl := resp.ExpiresAt.Sub(now)
	if ttl < time.Millisecond {
		return nil
	}
	_, respKey := l.keys(s)
	if err := l.rdb.Set(ctx, respKey, encodeCached(fingerprint, resp), ttl).Err(); err != nil {
		return fmt.Errorf("redis cache: %w", err)
	}
	return nil
}

// Settle is Cache and then Release, in one round trip: it stores resp for
// replay until resp.ExpiresAt (not when already expired; nothing when resp
// is nil) and deletes the lease if owner still holds it, reporting whether
// it did. An error means Redis did not answer, and neither may have
// happened: the cached response is an optimisation (Postgres replays it
// too) and the lease expires.
func (l *Leases) Settle(ctx context.Context, s Scope, fingerprint, owner string, resp *Response, now time.Time) (bool, error) {
	leaseKey, respKey := l.keys(s)
	var ttl int64
	var value []byte
	if resp != nil {
		ttl = resp.ExpiresAt.Sub(now).Milliseconds()
	}
	if ttl > 0 {
		value = encodeCached(fingerprint, resp)
	}
	n, err := settleScript.Run(ctx, l.rdb, []string{leaseKey, respKey}, leaseValue(owner, fingerprint), value, ttl).Int64()
	if err != nil {
		return false, fmt.Errorf("redis settle: %w", err)
	}
	return n == 1, nil
}

// Cached reports whether a finished response of s is in the replay cache
// (one EXISTS). The rate limiter uses it to classify a request before any
// idempotency work; Acquire remains the one that decides.
func (l *Leases) Cached(ctx context.Context, s Scope) (bool, error) {
	_, respKey := l.keys(s)
	n, err := l.rdb.Exists(ctx, respKey).Result()
	if err != nil {
		return false, fmt.Errorf("redis exists: %w", err)
	}
	return n == 1, nil
}

// Forget deletes the cached response of s (used when a key past its TTL is
// reused as new).
func (l *Leases) Forget(ctx context.Context, s Scope) error {
	_, respKey := l.keys(s)
	err := l.rdb.Del(ctx, respKey).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redis forget: %w", err)
	}
	return nil
}
