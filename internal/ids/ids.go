// Package ids makes the service's identifiers: a type prefix and a UUIDv7
// (RFC 9562) in hex, e.g. "ord_0193f2a4c5d67e8f9a0b1c2d3e4f5a6b". UUIDv7 is
// time-ordered, so ids sort roughly by creation and index well.
package ids

import (
	"encoding/hex"

	"github.com/google/uuid"
)

// New returns prefix + "_" + 32 hex digits of a fresh UUIDv7.
func New(prefix string) string {
	u := uuid.Must(uuid.NewV7())
	return prefix + "_" + hex.EncodeToString(u[:])
}

// Valid reports whether id has the form New(prefix) gives: prefix, "_" and
// 32 lowercase hex digits. A malformed id names nothing, so a lookup can
// answer "not found" without a query.
func Valid(prefix, id string) bool {
	if len(id) != len(prefix)+33 || id[:len(prefix)] != prefix || id[len(prefix)] != '_' {
		return false
	}
	for i := len(prefix) + 1; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
