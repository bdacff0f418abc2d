package checkout

import (
	"testing"
)

// TestStepKeyIsDeterministic: the Stripe key of an attempt derives from the
// order, the step and the attempt number alone.
func TestStepKeyIsDeterministic(t *testing.T) {
	t.Parallel()
	const order = "ord_0123456789abcdef0123456789abcdef"
	if got := StepKey(order, StepConfirm, 2); got != order+"/confirm/2" {
		t.Errorf("StepKey = %q", got)
	}
	if StepKey(order, StepCreate, 1) == StepKey(order, StepCreate, 2) {
		t.Error("two attempts share a key")
	}
}
