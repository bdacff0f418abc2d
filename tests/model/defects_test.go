//go:build model

package model

import "testing"

// The histories below are the defects as the model reaches them,
// shrunk by hand from generated ones (docs/testing.md, "Reintroducing the
// defects"). Each fails on the code before its fix.

// TestHistoryKeyFinishedAfterTTL: Stripe refuses our key for longer than
// IDEMPOTENCY_TTL; once it is back the key finishes, and its replay must
// not be a second order (issue 35, defect 1).
func TestHistoryKeyFinishedAfterTTL(t *testing.T) {
	h := newHistory(t, startStack(t))
	h.StripeFault("401 until cleared")
	h.Checkout("sku_tee", 1, "pm_card_visa")
	h.PassTime("IDEMPOTENCY_TTL")
	h.quiesce()
}
