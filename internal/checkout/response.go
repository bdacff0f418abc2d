package checkout

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/problem"
)

// responseForError is the stored response of a coded error that is an
// outcome (out_of_stock, order_not_cancelable, card_declined,
// payment_rejected).
func responseForError(e *problem.Error) *idempotency.Response {
	return idempotency.ProblemResponse(e)
}

// notCancelable is the stored 409 of a cancellation of order o, which is not
// in requires_action.
func notCancelable(o *orders.Order) *idempotency.Response {
	return responseForError(notCancelableError(
		fmt.Sprintf("The order is %s; only an order in requires_action can be canceled.", o.Status)))
}

// responseFor returns the response a key of route is finished with, given
// its order's state, or nil when the order is not settled for that route
// yet.
//
//	POST /v1/checkouts: paid 201 (and partially_refunded or refunded: the
//	payment succeeded, and the order has been refunded since, so the key
//	finishes with the outcome of its payment and the order as it is,
//	CONTRACT.md v3), requires_action 202 (both with Location and the
//	order), payment_failed or canceled 402 card_declined or
//	payment_rejected (problem with order_id).
//	POST /v1/orders/{id}/cancel: canceled 200 with the order; paid,
//	payment_failed, pending 409 order_not_cancelable.
func responseFor(route string, o *orders.Order) *idempotency.Response {
	body := func() []byte {
		b, err := json.Marshal(o)
		if err != nil {
			panic("checkout: encode order: " + err.Error()) // plain types
		}
		return b
	}
	if route == CancelRoute {
		switch o.Status {
		case orders.Canceled:
			return idempotency.JSONResponse(http.StatusOK, body(), "")
		case orders.RequiresAction:
			return nil
		}
		return notCancelable(o)
	}
	switch {
	case o.Status.PaidOnce():
		return idempotency.JSONResponse(http.StatusCreated, body(), "/v1/orders/"+o.ID)
	case o.Status == orders.RequiresAction:
		return idempotency.JSONResponse(http.StatusAccepted, body(), "/v1/orders/"+o.ID)
	case o.Status.LeavesTheWayToPaid():
		if o.FailureCode == CodeCardDeclined {
			return responseForError(cardDeclined(o.ID, o.DeclineCode))
		}
		var detail string
		switch o.FailureCode {
		case FailureActionTimeout:
			detail = "The customer did not complete the payment's authentication in time. The order is payment_failed and its stock was released."
		case FailurePaymentCanceled, FailureCanceled:
			detail = "The payment was canceled. The order is " + string(o.Status) + " and its stock was released."
		}
		return responseForError(paymentRejected(o.ID, detail))
	}
	return nil
}
