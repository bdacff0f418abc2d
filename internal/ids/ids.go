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
