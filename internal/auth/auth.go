// Package auth maps API keys (Authorization: Bearer <key>) to tenants.
//
// Only SHA-256 hashes of the keys are kept in memory, and a presented key is
// compared against every stored hash in constant time, so neither a memory
// dump nor response timing reveals a key.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/telemetry"
)

// DefaultKeys is the development value of CHECKOUT_API_KEYS. With
// APP_ENV=production the API refuses to start on it.
const DefaultKeys = "acme:sk_test_acme,globex:sk_test_globex"

type entry struct {
	hash   [sha256.Size]byte
	tenant string
}

// Keys is a set of API keys, each mapped to one tenant.
type Keys struct {
	entries []entry
}

// ParseKeys parses "tenant:key,tenant:key". It returns an error naming the
// bad entry when a pair lacks a tenant or a key, or a key appears twice.
func ParseKeys(s string) (*Keys, error) {
	k := &Keys{}
	seen := map[[sha256.Size]byte]bool{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		tenant, key, ok := strings.Cut(pair, ":")
		if !ok || tenant == "" || key == "" {
			return nil, fmt.Errorf("entry %d: want tenant:key", len(k.entries)+1)
		}
		h := sha256.Sum256([]byte(key))
		if seen[h] {
			return nil, fmt.Errorf("entry %d (tenant %s): key used twice", len(k.entries)+1, tenant)
		}
		seen[h] = true
		k.entries = append(k.entries, entry{hash: h, tenant: tenant})
	}
	if len(k.entries) == 0 {
		return nil, fmt.Errorf("no keys")
	}
	return k, nil
}

// Tenant returns the tenant of key, comparing with every stored hash in
// constant time.
func (k *Keys) Tenant(key string) (tenant string, ok bool) {
	h := sha256.Sum256([]byte(key))
	for _, e := range k.entries {
		if subtle.ConstantTimeCompare(h[:], e.hash[:]) == 1 {
			tenant, ok = e.tenant, true
		}
	}
	return tenant, ok
}

// UsesDevelopmentKey reports whether any key is one of DefaultKeys' keys,
// whatever tenant it is given to and whatever else is configured beside it.
func (k *Keys) UsesDevelopmentKey() bool {
	dev, _ := ParseKeys(DefaultKeys)
	for _, e := range k.entries {
		for _, d := range dev.entries {
			if subtle.ConstantTimeCompare(e.hash[:], d.hash[:]) == 1 {
				return true
			}
		}
	}
	return false
}

// Fingerprints returns "tenant:sha256-prefix" for each key, for logging the
// configuration without the keys themselves.
func (k *Keys) Fingerprints() []string {
	out := make([]string, len(k.entries))
	for i, e := range k.entries {
		out[i] = e.tenant + ":" + hex.EncodeToString(e.hash[:4])
	}
	return out
}

// ErrUnauthorized is the 401 answer to a missing or unknown API key.
var ErrUnauthorized = problem.New(problem.CodeUnauthorized,
	"Send a valid API key as Authorization: Bearer <key>.")

const tenantKey = "auth.tenant"

// Middleware authenticates the request and stores its tenant for TenantOf.
// A missing or unknown key ends the request with 401 unauthorized.
func Middleware(keys *Keys) gin.HandlerFunc {
	return func(c *gin.Context) {
		tenant, ok := "", false
		// Exactly one Authorization header: with two, a proxy reading the
		// last and this service reading the first would disagree on the
		// tenant.
		if values := c.Request.Header.Values("Authorization"); len(values) == 1 {
			scheme, token, _ := strings.Cut(values[0], " ")
			if strings.EqualFold(scheme, "Bearer") && token != "" {
				tenant, ok = keys.Tenant(strings.TrimSpace(token))
			}
		}
		if !ok {
			c.Header("WWW-Authenticate", `Bearer realm="checkout"`)
			problem.Write(c.Writer, ErrUnauthorized)
			c.Abort()
			return
		}
		c.Set(tenantKey, tenant)
		c.Request = c.Request.WithContext(telemetry.WithAttrs(c.Request.Context(), slog.String("tenant", tenant)))
		c.Next()
	}
}

// TenantOf returns the tenant Middleware authenticated, or "".
func TenantOf(c *gin.Context) string {
	return c.GetString(tenantKey)
}
