package checkout

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/onceonly/checkout/internal/httpbody"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/problem"
)

// Handler serves the checkout API.
type Handler struct {
	Service *Service
	Logger  *slog.Logger
	// Tenant returns the authenticated tenant of a request.
	Tenant func(*gin.Context) string
}

// Register mounts the routes on r; gateway guards the POST routes.
//
//	POST /v1/checkouts          create, resume or replay a checkout
//	POST /v1/orders/:id/cancel  cancel an order waiting for 3D Secure
//	GET  /v1/orders/:id         the tenant's order with its notifications
//	GET  /v1/products           the catalog with current stock
func (h *Handler) Register(r gin.IRoutes, gateway *idempotency.Gateway) {
	r.POST("/v1/checkouts", gateway.Middleware(Route), h.createCheckout)
	r.POST("/v1/orders/:id/cancel", gateway.Middleware(CancelRoute, idempotency.EmptyBodyIsObject), h.cancelOrder)
	r.GET("/v1/orders/:id", h.getOrder)
	r.GET("/v1/products", h.listProducts)
}

func (h *Handler) createCheckout(c *gin.Context) {
	req := idempotency.RequestOf(c)
	in, inputErrs := decodeRequest(req.Body)
	resp, replayed, err := h.Service.Checkout(c.Request.Context(), CheckoutCommand{
		Tenant: req.Scope.Tenant, IdempotencyKey: req.Scope.Key,
		Fingerprint: req.Fingerprint, Owner: req.Owner,
		Input: in, InputErrors: inputErrs,
	})
	if err != nil {
		h.logFailure(c, err, req.Fail(c.Writer, problemFor(err)))
		return
	}
	req.Respond(c.Writer, resp, replayed)
}

func (h *Handler) cancelOrder(c *gin.Context) {
	req := idempotency.RequestOf(c)
	// The body has no members: {} or none at all.
	var errs []FieldError
	if body, ok := httpbody.Object(req.Body, "", "must be a JSON object", &errs); ok {
		body.Unknown()
	}
	if len(errs) > 0 {
		h.logFailure(c, nil, req.Fail(c.Writer, problemFor(ValidationError(errs))))
		return
	}
	resp, replayed, err := h.Service.CancelOrder(c.Request.Context(), CancelCommand{
		Tenant: req.Scope.Tenant, IdempotencyKey: req.Scope.Key,
		Fingerprint: req.Fingerprint, Owner: req.Owner, OrderID: c.Param("id"),
	})
	if err != nil {
		h.logFailure(c, err, req.Fail(c.Writer, problemFor(err)))
		return
	}
	req.Respond(c.Writer, resp, replayed)
}

func (h *Handler) getOrder(c *gin.Context) {
	view, err := h.Service.Order(c.Request.Context(), h.Tenant(c), c.Param("id"))
	if err != nil {
		h.logFailure(c, err, problem.Write(c.Writer, problemFor(err)))
		return
	}
	c.JSON(http.StatusOK, view)
}

func (h *Handler) listProducts(c *gin.Context) {
	ps, err := h.Service.Products(c.Request.Context())
	if err != nil {
		h.logFailure(c, err, problem.Write(c.Writer, problemFor(err)))
		return
	}
	c.JSON(http.StatusOK, gin.H{"data": ps})
}

// logFailure logs an error once: unknown errors (answered 500) as errors,
// 5xx problems with their cause as warnings; 4xx answers are not logged.
func (h *Handler) logFailure(c *gin.Context, err error, known bool) {
	switch {
	case err == nil:
	case !known:
		h.Logger.ErrorContext(c.Request.Context(), "request failed", "err", err)
	case problem.From(problemFor(err)).Status >= 500:
		h.Logger.WarnContext(c.Request.Context(), "request failed", "err", err)
	}
}

// details are the checkout domain's default details, by code; an Error's
// own Detail replaces its code's.
var details = map[string]string{
	CodeValidation:          "The request body has invalid fields; see errors.",
	CodeNotFound:            "No such order.",
	CodeOutOfStock:          "At least one item is not available in the requested quantity. No order was created and nothing was charged.",
	CodeNotCancelable:       "Only an order waiting for the customer's authentication (requires_action) can be canceled.",
	CodeCardDeclined:        "The payment was declined. The order is payment_failed and its stock was released.",
	CodePaymentRejected:     "The payment provider refused the payment request (for example an unknown payment method). The order is payment_failed and its stock was released; retrying cannot succeed.",
	CodePaymentUnavailable:  "The payment provider did not answer, or its answer is not known yet. Retry with the same Idempotency-Key: it resumes this request where it stopped and never charges twice.",
	codeProviderCredentials: "The payment provider refused this service's credentials, so this payment is not settled yet; the order keeps its stock. Retry with the same Idempotency-Key once the service is fixed: it resumes this request and never charges twice.",
	CodeUnavailable:         "A dependency is unavailable. Retry with the same Idempotency-Key: it resumes this request where it stopped and never charges twice.",
}

// coded returns the coded error the client sees for e (its detail, or its
// code's, and its members: errors, order_id, decline_code), without the
// cause. The problem package's table gives it its status and title.
func (e *Error) coded() *problem.Error {
	detail := e.Detail
	if detail == "" {
		detail = details[e.Code]
	}
	p := problem.New(problem.Code(e.Code), detail)
	if e.RetryAfter > 0 {
		p = p.WithRetryAfter(e.RetryAfter)
	}
	if e.Fields != nil {
		p = p.With("errors", e.Fields)
	}
	if e.OrderID != "" && (e.Code == CodeCardDeclined || e.Code == CodePaymentRejected) {
		p = p.With("order_id", e.OrderID)
	}
	if e.DeclineCode != "" {
		p = p.With("decline_code", e.DeclineCode)
	}
	return p
}

// problemFor turns an error into the one the client sees: a domain *Error
// as its coded problem.Error (the cause stays wrapped for the log), a coded
// error of the idempotency layer as it is, anything else the generic 500.
func problemFor(err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err // a problem.Error of the idempotency layer, or a 500
	}
	if e.Cause != nil {
		return problem.Wrap(e.coded(), e.Cause)
	}
	return e.coded()
}

// responseForError is the stored response of a domain error that is an
// outcome (out_of_stock, order_not_cancelable, card_declined,
// payment_rejected).
func responseForError(e *Error) *idempotency.Response {
	return idempotency.ProblemResponse(e.coded())
}

// notCancelable is the stored 409 of a cancellation of order o, which is not
// in requires_action.
func notCancelable(o *orders.Order) *idempotency.Response {
	return responseForError(&Error{Code: CodeNotCancelable,
		Detail: fmt.Sprintf("The order is %s; only an order in requires_action can be canceled.", o.Status)})
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
			return responseForError(&Error{Code: CodeCardDeclined, OrderID: o.ID, DeclineCode: o.DeclineCode})
		}
		e := &Error{Code: CodePaymentRejected, OrderID: o.ID}
		switch o.FailureCode {
		case FailureActionTimeout:
			e.Detail = "The customer did not complete the payment's authentication in time. The order is payment_failed and its stock was released."
		case FailurePaymentCanceled, FailureCanceled:
			e.Detail = "The payment was canceled. The order is " + string(o.Status) + " and its stock was released."
		}
		return responseForError(e)
	}
	return nil
}

// decodeRequest decodes the canonical (RFC 8785) checkout body member by
// member (httpbody.Members), so that each wrong type is reported at its
// own path ("items[0].quantity") and unknown members beside every other
// error.
func decodeRequest(body []byte) (*Request, []FieldError) {
	var in Request
	var errs []FieldError
	top, ok := httpbody.Object(body, "", "must be a JSON object", &errs)
	if !ok {
		return &in, errs
	}
	top.Unknown("email", "items", "payment_method", "return_url")
	top.String("email", &in.Email)
	top.String("payment_method", &in.PaymentMethod)
	top.String("return_url", &in.ReturnURL)
	if raw, ok := top.Get("items"); ok {
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil || items == nil {
			errs = append(errs, FieldError{Field: "items", Message: "must be an array of items"})
		}
		in.Items = make([]RequestItem, len(items))
		for i, rawItem := range items {
			item, ok := httpbody.Object(rawItem, fmt.Sprintf("items[%d]", i), `must be an object like {"sku":"sku_tee","quantity":1}`, &errs)
			if !ok {
				continue
			}
			item.Unknown("sku", "quantity")
			item.String("sku", &in.Items[i].SKU)
			// The canonical form writes every integral number as an
			// integer (2.0 and 2e0 are 2), so this accepts exactly what
			// the fingerprint treats as the same request.
			item.Decode("quantity", &in.Items[i].Quantity, fmt.Sprintf("must be an integer between 1 and %d", MaxQuantity))
		}
	}
	return &in, errs
}
