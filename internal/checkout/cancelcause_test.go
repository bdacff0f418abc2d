package checkout

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/postgres/pgtest"
	"github.com/onceonly/checkout/internal/stripestep"
)

// TestCancelCause reads why this service canceled a PaymentIntent from the
// cancel attempts of the step log: the customer's cancel whatever else was
// written (also one written before cancels carried a cause), else the
// first cause written for that PaymentIntent, the timeout for an abandoned
// cancel written before cancels carried a cause, and nothing for a
// PaymentIntent no cancel of ours names (canceled in the Dashboard) or an
// orphan's cancel.
func TestCancelCause(t *testing.T) {
	t.Parallel()
	db, _ := pgtest.NewDB(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, id := range []string{"ord_rejected", "ord_customer", "ord_before", "ord_legacy", "ord_orphan"} {
		require.NoError(t, orders.Insert(ctx, db, &orders.Order{ID: id, TenantID: "acme", Status: orders.PendingPayment,
			Email: "buyer@example.com", Currency: "usd", AmountTotal: 2500, PaymentMethod: "pm_card_visa", CreatedAt: now,
			Items: []orders.OrderItem{{SKU: "sku_tee", Quantity: 1, UnitAmount: 2500, Amount: 2500}}}))
	}
	write := func(orderID string, n int, req CancelIntentRequest) {
		t.Helper()
		b, err := json.Marshal(req)
		require.NoError(t, err)
		require.NoError(t, stripestep.Insert(ctx, db, stripestep.NewAttempt(orderID, "acme", StepCancel, n, req.PaymentIntentID, b, now)))
	}
	write("ord_rejected", 1, CancelIntentRequest{PaymentIntentID: "pi_r", Reason: CancelAbandoned, Cause: CodePaymentRejected})
	write("ord_rejected", 2, CancelIntentRequest{PaymentIntentID: "pi_r", Reason: CancelAbandoned, Cause: FailureActionTimeout})
	write("ord_customer", 1, CancelIntentRequest{PaymentIntentID: "pi_c", Reason: CancelAbandoned, Cause: FailureActionTimeout})
	write("ord_customer", 2, CancelIntentRequest{PaymentIntentID: "pi_c", Reason: CancelRequestedByCustomer, Cause: FailureCanceled})
	write("ord_before", 1, CancelIntentRequest{PaymentIntentID: "pi_b", Reason: CancelRequestedByCustomer})
	write("ord_legacy", 1, CancelIntentRequest{PaymentIntentID: "pi_l", Reason: CancelAbandoned})
	write("ord_orphan", 1, CancelIntentRequest{PaymentIntentID: "pi_o", Reason: CancelDuplicate})

	for _, tc := range []struct{ name, orderID, pi, want string }{
		{"the first cause written", "ord_rejected", "pi_r", CodePaymentRejected},
		{"another PaymentIntent of the order", "ord_rejected", "pi_other", ""},
		{"the customer's cancel wins", "ord_customer", "pi_c", FailureCanceled},
		{"a customer's cancel written without a cause", "ord_before", "pi_b", FailureCanceled},
		{"an abandoned cancel written before causes were: the timeout", "ord_legacy", "pi_l", FailureActionTimeout},
		{"an orphan's cancel", "ord_orphan", "pi_o", ""},
		{"no cancel at all", "ord_none", "pi_n", ""},
	} {
		got, err := cancelCause(ctx, db, tc.orderID, tc.pi)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, got, tc.name)
	}
}

// TestChangeForACanceledPaymentIntent: the order change a canceled
// PaymentIntent calls for, from Stripe's state and the cause this service
// wrote with its cancel (cancelCause). The cause decides where Stripe's
// cancellation_reason cannot: abandoned is this service's reason for a
// rejection, a decline and a timeout alike.
func TestChangeForACanceledPaymentIntent(t *testing.T) {
	t.Parallel()
	canceled := func(reason, lastError string) PaymentIntentState {
		return PaymentIntentState{ID: "pi_1", Status: PICanceled, CancellationReason: reason, LastErrorCode: lastError}
	}
	waiting := &run{o: &Order{Status: orders.RequiresAction}}
	for _, tc := range []struct {
		name  string
		pi    PaymentIntentState
		cause string
		to    orders.Status
		code  string
	}{
		{"a rejection closed by us", canceled(CancelAbandoned, ""), CodePaymentRejected, orders.PaymentFailed, CodePaymentRejected},
		{"a timeout closed by us", canceled(CancelAbandoned, ""), FailureActionTimeout, orders.PaymentFailed, FailureActionTimeout},
		{"a decline closed by us", canceled(CancelAbandoned, "card_declined"), CodePaymentRejected, orders.PaymentFailed, CodeCardDeclined},
		{"the customer's cancel, as we wrote it", canceled(CancelAbandoned, ""), FailureCanceled, orders.Canceled, FailureCanceled},
		{"the customer's cancel, as we sent it", canceled(CancelRequestedByCustomer, ""), FailureCanceled, orders.Canceled, FailureCanceled},
		{"canceled by someone else", canceled("fraudulent", ""), "", orders.PaymentFailed, FailurePaymentCanceled},
	} {
		ch, ok := waiting.changeFor(tc.pi, tc.cause)
		require.True(t, ok, tc.name)
		require.Equal(t, tc.to, ch.To, tc.name)
		require.Equal(t, tc.code, ch.FailureCode, tc.name)
	}
}

// TestChangeForADashboardCancel: a PaymentIntent canceled outside the
// service (the Dashboard, or Stripe itself), with each cancellation_reason
// Stripe documents
// (https://docs.stripe.com/api/payment_intents/object#payment_intent_object-cancellation_reason)
// and none, ends an order on its way to paid wherever it waits: the change
// is one the order's status may take (issue 35, defect 4: before,
// requested_by_customer asked a pending_payment order to become canceled,
// which only requires_action may, and the order and its key stuck). Only
// requested_by_customer from requires_action is canceled; everything else
// is payment_failed with payment_canceled (not a timeout: no cancel of
// ours is written).
func TestChangeForADashboardCancel(t *testing.T) {
	t.Parallel()
	reasons := []string{"", CancelDuplicate, "fraudulent", CancelRequestedByCustomer, CancelAbandoned,
		"failed_invoice", "void_invoice", "automatic"}
	for _, from := range []orders.Status{orders.PendingPayment, orders.PaymentUnknown, orders.RequiresAction} {
		for _, reason := range reasons {
			r := &run{o: &Order{Status: from}}
			ch, ok := r.changeFor(PaymentIntentState{ID: "pi_1", Status: PICanceled, CancellationReason: reason}, "")
			require.True(t, ok, "%s, reason %q", from, reason)
			require.True(t, from.CanMoveTo(ch.To), "%s, reason %q: %s -> %s is no transition", from, reason, from, ch.To)
			require.True(t, ch.To.LeavesTheWayToPaid(), "%s, reason %q", from, reason)
			want := orders.PaymentFailed
			if reason == CancelRequestedByCustomer && from == orders.RequiresAction {
				want = orders.Canceled
			}
			require.Equal(t, want, ch.To, "%s, reason %q", from, reason)
			require.Equal(t, FailurePaymentCanceled, ch.FailureCode, "%s, reason %q", from, reason)
		}
	}
}
