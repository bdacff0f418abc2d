package orders

import "testing"

// TestTransitionsOnlyMoveForward: every transition leaves a status for one
// strictly later in the contract's order (pending_payment <
// payment_unknown < requires_action < paid, payment_failed, canceled <
// partially_refunded < refunded), no final status (payment_failed,
// canceled, refunded) is ever left, and paid is left only for a refund
// status.
func TestTransitionsOnlyMoveForward(t *testing.T) {
	t.Parallel()
	rank := map[Status]int{
		PendingPayment: 0, PaymentUnknown: 1, RequiresAction: 2,
		Paid: 3, PaymentFailed: 3, Canceled: 3,
		PartiallyRefunded: 4, Refunded: 5,
	}
	final := map[Status]bool{PaymentFailed: true, Canceled: true, Refunded: true}
	for from, tos := range transitions {
		for _, to := range tos {
			if rank[from] >= rank[to] {
				t.Errorf("%s -> %s goes back or sideways", from, to)
			}
			if final[from] {
				t.Errorf("%s -> %s leaves a final status", from, to)
			}
			if from == Paid && to != PartiallyRefunded && to != Refunded {
				t.Errorf("%s -> %s leaves paid other than by a refund", from, to)
			}
		}
	}
	if got := From(Canceled); len(got) != 1 || got[0] != RequiresAction {
		t.Errorf("canceled is reachable from %v, want only requires_action (CONTRACT.md)", got)
	}
	if len(rank) != len(all) || len(transitions) != len(all) {
		t.Errorf("the transitions table and the ranks must name every status")
	}
}
