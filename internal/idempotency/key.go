// Package idempotency makes a POST safe to retry: the Idempotency-Key
// header, the request fingerprint, the Redis lease, the Postgres key store
// that is the authority, and the gin middleware that ties them together.
//
// Semantics follow Stripe's idempotent requests
// (https://docs.stripe.com/api/idempotent_requests) and the IETF draft "The
// Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-header):
// a key is scoped to (tenant, method and route template, key); a finished key
// replays its stored response; the same key with another payload is 422; a
// key whose request is still executing is 409.
package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/gowebpki/jcs"

	"github.com/onceonly/checkout/internal/problem"
)

// Header is the request header that carries the key.
const Header = "Idempotency-Key"

// ReplayedHeader is set to "true" on every replayed response and never on a
// first response.
const ReplayedHeader = "Idempotent-Replayed"

// MaxKeyLength is the longest key accepted, in bytes (Stripe allows 255).
const MaxKeyLength = 255

// The coded errors of this package, in the contract's words.
var (
	ErrKeyMissing = problem.New(problem.CodeIdempotencyKeyMissing,
		"This endpoint requires an Idempotency-Key header: a unique value, such as a UUID, that you send again on every retry of the same request.")
	ErrKeyInvalid = problem.New(problem.CodeIdempotencyKeyInvalid,
		"The Idempotency-Key must be 1 to 255 printable ASCII characters.")
	ErrKeyReused = problem.New(problem.CodeIdempotencyKeyReused,
		"This Idempotency-Key was already used with a different request (another body, or another resource on this route). Use a new key for a new request.")
	ErrKeyInUse = problem.New(problem.CodeIdempotencyKeyInUse,
		"A request with this Idempotency-Key is still being processed. Retry later with the same key to get its response.")
	ErrUnavailable = problem.New(problem.CodeUnavailable,
		"A dependency is unavailable. Nothing was executed for this request that a retry with the same Idempotency-Key would repeat.")
	ErrMalformedJSON = problem.New(problem.CodeMalformedJSON,
		"The request body is not valid JSON.")
	ErrUnsupportedMediaType = problem.New(problem.CodeUnsupportedMediaType,
		"Send the body once, uncompressed, as UTF-8 JSON with exactly one Content-Type: application/json (a charset, if any, must be utf-8; no Content-Encoding).")
	ErrPayloadTooLarge = problem.New(problem.CodePayloadTooLarge,
		"The request body must not exceed 64 KiB.")
)

// ValidateKey returns ErrKeyMissing for an empty key and ErrKeyInvalid for a
// key longer than MaxKeyLength or with a byte outside printable ASCII
// (0x20-0x7E).
func ValidateKey(key string) error {
	if key == "" {
		return ErrKeyMissing
	}
	if len(key) > MaxKeyLength {
		return ErrKeyInvalid
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return ErrKeyInvalid
		}
	}
	return nil
}

// Canonicalize returns the RFC 8785 (JSON Canonicalization Scheme) form of
// body: members sorted, no insignificant whitespace, numbers in their
// shortest form (2.0 and 2e0 become 2). When body is not valid JSON or has
// a duplicate member name, which RFC 8785 forbids, it returns a
// malformed_json problem (ErrMalformedJSON's code) whose detail gives the
// parser's reason.
func Canonicalize(body []byte) ([]byte, error) {
	canonical, err := jcs.Transform(body)
	if err != nil {
		// The parser's reason ("Duplicate key: email") helps the client fix
		// the body; it carries nothing of ours.
		return nil, problem.New(problem.CodeMalformedJSON, "The request body is not valid JSON: "+err.Error())
	}
	return canonical, nil
}

// errKeyRepeated answers a request with more than one Idempotency-Key.
var errKeyRepeated = problem.New(problem.CodeIdempotencyKeyInvalid, "Send exactly one Idempotency-Key header.")

// KeyFromHeader returns the request's key. It accepts the plain form Stripe
// uses (Idempotency-Key: 8e03978e-…) and the Structured Field string of the
// IETF draft (Idempotency-Key: "8e03978e-…"); both name the same key. It
// returns ErrKeyMissing without the header, and ErrKeyInvalid for a
// repeated header, a malformed quoted string, or a key ValidateKey rejects.
func KeyFromHeader(h http.Header) (string, error) {
	values := h.Values(Header)
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", errKeyRepeated
	}
	key := values[0]
	if len(key) >= 2 && key[0] == '"' {
		unquoted, ok := parseSFString(key)
		if !ok {
			return "", ErrKeyInvalid
		}
		key = unquoted
	}
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// parseSFString parses an RFC 8941 sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE.
func parseSFString(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i >= len(s)-1 || (s[i] != '"' && s[i] != '\\') {
				return "", false
			}
			b.WriteByte(s[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// Fingerprint returns the hex SHA-256 of method, route template and the RFC
// 8785 form of body, so the same JSON with other whitespace, member order
// or number spelling has the same fingerprint. It returns ErrMalformedJSON
// when body is not valid JSON.
func Fingerprint(method, route string, body []byte) (string, error) {
	canonical, err := Canonicalize(body)
	if err != nil {
		return "", err
	}
	return fingerprint(method, route, canonical), nil
}

func fingerprint(method, route string, canonical []byte) string {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(route))
	h.Write([]byte{0})
	h.Write(canonical)
	return hex.EncodeToString(h.Sum(nil))
}

// Scope identifies one key: the same key value from another tenant or on
// another route is a different request.
type Scope struct {
	Tenant string
	// Route is the method and route template, e.g. "POST /v1/checkouts".
	Route string
	Key   string
}

// Hash returns hex(sha256(tenant, route, key)): the scope's name in Redis
// and in logs, so neither ever holds the raw key.
func (s Scope) Hash() string {
	h := sha256.New()
	h.Write([]byte(s.Tenant))
	h.Write([]byte{0})
	h.Write([]byte(s.Route))
	h.Write([]byte{0})
	h.Write([]byte(s.Key))
	return hex.EncodeToString(h.Sum(nil))
}
