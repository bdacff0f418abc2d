package stripestep_test

import (
	"testing"
	"time"

	"github.com/onceonly/checkout/internal/stripestep"
)

// TestKey: the key is the persisted state it is derived from, and nothing
// else: the same inputs give the same key, another attempt another key.
func TestKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		object, step string
		attempt      int
		want         string
	}{
		{"ord_1", "create", 1, "ord_1/create/1"},
		{"ord_1", "confirm", 2, "ord_1/confirm/2"},
		{"ord_1", "refund:ref_9", 1, "ord_1/refund:ref_9/1"},
		{"ord_0123456789abcdef0123456789abcdef", stripestep.StepConfirm, 2, "ord_0123456789abcdef0123456789abcdef/confirm/2"},
		{"ord_1", stripestep.RefundStep("rf_2"), 3, "ord_1/refund:rf_2/3"},
		{"ord_1", stripestep.StrayRefundStep("pi_7"), 1, "ord_1/stray-refund:pi_7/1"},
	} {
		if got := stripestep.Key(c.object, c.step, c.attempt); got != c.want {
			t.Errorf("Key(%q, %q, %d) = %q, want %q", c.object, c.step, c.attempt, got, c.want)
		}
	}
	if stripestep.Key("ord_1", "confirm", 1) == stripestep.Key("ord_1", "confirm", 2) {
		t.Error("two attempts of one step share a key")
	}
}

// TestResendable: an attempt's key is sent again as it is only while it
// is open and younger than ResendWindow; past it, it is reconciled.
func TestResendable(t *testing.T) {
	t.Parallel()
	now := time.Now()
	a := stripestep.NewAttempt("ord_1", "acme", stripestep.StepCreate, 1, "", []byte(`{}`), now)
	if !a.Resendable(now.Add(stripestep.ResendWindow - time.Second)) {
		t.Error("an open attempt within the window is not resendable")
	}
	if a.Resendable(now.Add(stripestep.ResendWindow + time.Second)) {
		t.Error("an open attempt past the window is resendable")
	}
	a.Outcome = stripestep.Indeterminate
	if a.Resendable(now) {
		t.Error("an answered attempt is resendable")
	}
}
