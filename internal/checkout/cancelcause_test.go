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
// first cause written for that PaymentIntent, and nothing for a
// PaymentIntent no cancel of ours names, an orphan's cancel, or a cancel
// written without a cause.
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
		{"a cancel written without a cause", "ord_legacy", "pi_l", ""},
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
		{"closed by us before causes were written", canceled(CancelAbandoned, ""), "", orders.PaymentFailed, FailureActionTimeout},
		{"the customer's cancel, as we wrote it", canceled(CancelAbandoned, ""), FailureCanceled, orders.Canceled, FailureCanceled},
		{"the customer's cancel, as Stripe says", canceled(CancelRequestedByCustomer, ""), "", orders.Canceled, FailureCanceled},
		{"canceled by someone else", canceled("fraudulent", ""), "", orders.PaymentFailed, FailurePaymentCanceled},
	} {
		ch, ok := (&run{}).changeFor(tc.pi, tc.cause)
		require.True(t, ok, tc.name)
		require.Equal(t, tc.to, ch.To, tc.name)
		require.Equal(t, tc.code, ch.FailureCode, tc.name)
	}
}
