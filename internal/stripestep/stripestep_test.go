package stripestep_test

import (
	"testing"

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
	} {
		if got := stripestep.Key(c.object, c.step, c.attempt); got != c.want {
			t.Errorf("Key(%q, %q, %d) = %q, want %q", c.object, c.step, c.attempt, got, c.want)
		}
	}
	if stripestep.Key("ord_1", "confirm", 1) == stripestep.Key("ord_1", "confirm", 2) {
		t.Error("two attempts of one step share a key")
	}
}
