//go:build model

package model

import "testing"

// The histories below are the defects as the model reaches them,
// shrunk by hand from generated ones (docs/testing.md, "What it found, and
// reintroducing the defects"). Each fails on the code before its fix.

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

// TestHistoryParkedRefundRetried: a refund whose create Stripe answers with
// a stored 500 is parked after REFUND_RETRY_AFTER (equal to
// IDEMPOTENCY_TTL, as both defaults are 24h); the client's retry of the
// same request must replay, not refund again (defect 2).
func TestHistoryParkedRefundRetried(t *testing.T) {
	h := newHistory(t, startStack(t))
	h.Checkout("sku_hoodie", 1, "pm_card_visa")
	h.StripeFault("stored 500 on refund")
	h.Refund(0, 2000)
	h.PassTime("REFUND_RETRY_AFTER")
	h.quiesce()
}

// TestHistoryWorkerRestartsWithBacklog: five restarts of a worker with a
// backlog must not dead-letter healthy events (defect 3).
func TestHistoryWorkerRestartsWithBacklog(t *testing.T) {
	h := newHistory(t, startStack(t))
	h.WorkerBacklog(8)
	h.quiesce()
}

// TestHistoryDashboardCancelUnansweredConfirm: the api dies while Stripe
// is slow to answer (the PaymentIntent created, the order
// pending_payment), support cancels the PaymentIntent in the Dashboard;
// the order must end and its key answer (defect 4).
func TestHistoryDashboardCancelUnansweredConfirm(t *testing.T) {
	h := newHistory(t, startStack(t))
	h.StripeFault("slow answer")
	h.CrashDuringCheckout("api", 300)
	h.DashboardCancel(0, "requested_by_customer")
	h.quiesce()
}

// TestHistoryDashboardRefund: a refund made in the Dashboard must reach
// the order (defect 7).
func TestHistoryDashboardRefund(t *testing.T) {
	h := newHistory(t, startStack(t))
	h.Checkout("sku_hoodie", 1, "pm_card_visa")
	h.DashboardRefund(0, 1000)
	h.quiesce()
}
