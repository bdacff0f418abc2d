package client_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/client"
)

// sentinels are the client's sentinel errors; each *Error is exactly one
// of them, or none.
var sentinels = []error{
	client.ErrPaymentDeclined, client.ErrOutOfStock, client.ErrKeyReused, client.ErrKeyInUse,
	client.ErrInvalidRequest, client.ErrUnauthorized, client.ErrNotFound, client.ErrOrderState,
	client.ErrUnavailable, client.ErrInternal,
}

// TestErrorIsItsCodesFamily: errors.Is finds the sentinel of an answer's
// code (or, without a problem body, of its status), and no other one;
// errors.As still finds the *Error, with the answer's request id.
func TestErrorIsItsCodesFamily(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		rep  reply
		want error
	}{
		{"a declined card is a declined payment", reply{status: 402, code: "card_declined"}, client.ErrPaymentDeclined},
		{"a rejected payment is a declined payment", reply{status: 402, code: "payment_rejected"}, client.ErrPaymentDeclined},
		{"out of stock", reply{status: 409, code: "out_of_stock"}, client.ErrOutOfStock},
		{"a key reused for another body", reply{status: 422, code: "idempotency_key_reused"}, client.ErrKeyReused},
		{"a validation error is an invalid request", reply{status: 400, code: "validation_error"}, client.ErrInvalidRequest},
		{"malformed JSON is an invalid request", reply{status: 400, code: "malformed_json"}, client.ErrInvalidRequest},
		{"an unknown API key", reply{status: 401, code: "unauthorized"}, client.ErrUnauthorized},
		{"an unknown order", reply{status: 404, code: "not_found"}, client.ErrNotFound},
		{"an order that cannot be canceled", reply{status: 409, code: "order_not_cancelable"}, client.ErrOrderState},
		{"a refund past the payment", reply{status: 409, code: "refund_exceeds_payment"}, client.ErrOrderState},
		{"the service's unknown error", reply{status: 500, code: "internal"}, client.ErrInternal},
		{"a key still in use when retrying stopped", reply{status: 409, code: "idempotency_key_in_use"}, client.ErrKeyInUse},
		{"a 503 when retrying stopped", reply{status: 503, code: "payment_provider_unavailable"}, client.ErrUnavailable},
		{"a gateway's page without a problem", reply{status: 504, body: "<html>gateway timeout</html>"}, client.ErrUnavailable},
		{"an unknown 4xx is no family", reply{status: http.StatusTeapot, body: "short and stout"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeAPI(t, tc.rep)
			c, _ := setup(t, f, client.RetryPolicy{MaxAttempts: 1})
			_, err := c.CreateCheckout(ctx(t), "", client.CheckoutRequest{Email: "a@example.com", PaymentMethod: "pm_card_visa"})
			require.Error(t, err)
			for _, s := range sentinels {
				require.Equal(t, s == tc.want, errors.Is(err, s), "errors.Is(err, %v)", s)
			}
			var e *client.Error
			require.ErrorAs(t, err, &e)
			require.Equal(t, "req_1", e.RequestID, "the answer's X-Request-Id")
			require.Contains(t, e.Error(), "request req_1")
		})
	}
}

// TestNoAnswerIsUnavailable: a call that got no answer at all (the api is
// not listening) is ErrUnavailable, with no request id.
func TestNoAnswerIsUnavailable(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, reply{status: 200})
	f.srv.Close()
	c, _ := setup(t, f, client.RetryPolicy{MaxAttempts: 1})
	_, err := c.GetOrder(ctx(t), "ord_x")
	require.ErrorIs(t, err, client.ErrUnavailable)
	var e *client.Error
	require.ErrorAs(t, err, &e)
	require.Empty(t, e.RequestID)
}

// TestResultKeepsRequestID: a success carries its answer's X-Request-Id.
func TestResultKeepsRequestID(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, reply{status: 503, code: "unavailable"}, reply{status: 201})
	c, _ := setup(t, f, client.RetryPolicy{})
	r, err := c.CreateCheckout(ctx(t), "", client.CheckoutRequest{Email: "a@example.com", PaymentMethod: "pm_card_visa"})
	require.NoError(t, err)
	require.Equal(t, "req_2", r.RequestID, "the final answer's, not the first attempt's")
}
