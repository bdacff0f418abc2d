package checkout

import "testing"

// TestTransitionsOnlyMoveForward: every transition the saga can apply leaves
// a status for one strictly later in the contract's order
// (pending_payment < payment_unknown < requires_action < paid,
// payment_failed, canceled), and no final status is ever left.
func TestTransitionsOnlyMoveForward(t *testing.T) {
	t.Parallel()
	rank := map[string]int{
		StatusPendingPayment: 0, StatusPaymentUnknown: 1, StatusRequiresAction: 2,
		StatusPaid: 3, StatusPaymentFailed: 3, StatusCanceled: 3,
	}
	for to, froms := range transitionFrom {
		for _, from := range froms {
			if rank[from] >= rank[to] {
				t.Errorf("%s -> %s goes back or sideways", from, to)
			}
			if rank[from] == 3 {
				t.Errorf("%s -> %s leaves a final status", from, to)
			}
		}
	}
	if got := transitionFrom[StatusCanceled]; len(got) != 1 || got[0] != StatusRequiresAction {
		t.Errorf("canceled is reachable from %v, want only requires_action (CONTRACT.md)", got)
	}
}
