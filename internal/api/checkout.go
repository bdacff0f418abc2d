package api

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/httpbody"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/problem"
)

// checkoutHandler serves the checkout API: it decodes requests into
// checkout's commands and queries and writes their answers.
type checkoutHandler struct {
	Service *checkout.Service
	// DB is where the order view reads an order's refunds and
	// notifications.
	DB     *gorm.DB
	Logger *slog.Logger
	// Tenant returns the authenticated tenant of a request.
	Tenant func(*gin.Context) string
}

// Register mounts the routes on r; gateway guards the POST routes.
//
//	POST /v1/checkouts          create, resume or replay a checkout
//	POST /v1/orders/:id/cancel  cancel an order waiting for 3D Secure
//	GET  /v1/orders/:id         the tenant's order with its notifications
//	GET  /v1/products           the catalog with current stock
func (h *checkoutHandler) Register(r gin.IRoutes, gateway *idempotency.Gateway) {
	r.POST("/v1/checkouts", gateway.Middleware(checkout.Route), h.createCheckout)
	r.POST("/v1/orders/:id/cancel", gateway.Middleware(checkout.CancelRoute, idempotency.EmptyBodyIsObject), h.cancelOrder)
	r.GET("/v1/orders/:id", h.getOrder)
	r.GET("/v1/products", h.listProducts)
}

func (h *checkoutHandler) createCheckout(c *gin.Context) {
	req := idempotency.RequestOf(c)
	in, inputErrs := decodeCheckout(req.Body)
	resp, replayed, err := h.Service.Checkout(c.Request.Context(), checkout.CheckoutCommand{
		Tenant: req.Scope.Tenant, IdempotencyKey: req.Scope.Key,
		Fingerprint: req.Fingerprint, Owner: req.Owner,
		Input: in, InputErrors: inputErrs,
	})
	if err != nil {
		logFailure(h.Logger, c, err, req.Fail(c.Writer, err))
		return
	}
	req.Respond(c.Writer, resp, replayed)
}

func (h *checkoutHandler) cancelOrder(c *gin.Context) {
	req := idempotency.RequestOf(c)
	// The body has no members: {} or none at all.
	var errs []problem.FieldError
	if body, ok := httpbody.Object(req.Body, "", "must be a JSON object", &errs); ok {
		body.Unknown()
	}
	if len(errs) > 0 {
		req.Fail(c.Writer, problem.Validation(errs))
		return
	}
	resp, replayed, err := h.Service.CancelOrder(c.Request.Context(), checkout.CancelCommand{
		Tenant: req.Scope.Tenant, IdempotencyKey: req.Scope.Key,
		Fingerprint: req.Fingerprint, Owner: req.Owner, OrderID: c.Param("id"),
	})
	if err != nil {
		logFailure(h.Logger, c, err, req.Fail(c.Writer, err))
		return
	}
	req.Respond(c.Writer, resp, replayed)
}

func (h *checkoutHandler) getOrder(c *gin.Context) {
	view, err := orderView(c.Request.Context(), h.Service, h.DB, h.Tenant(c), c.Param("id"))
	if err != nil {
		logFailure(h.Logger, c, err, problem.Write(c.Writer, err))
		return
	}
	c.JSON(http.StatusOK, view)
}

func (h *checkoutHandler) listProducts(c *gin.Context) {
	ps, err := h.Service.Products(c.Request.Context())
	if err != nil {
		logFailure(h.Logger, c, err, problem.Write(c.Writer, err))
		return
	}
	c.JSON(http.StatusOK, gin.H{"data": ps})
}

// logFailure logs a failed request's error once, after it was written
// (known is what problem.Write or idempotency.Request.Fail reported):
// unknown errors (answered 500) as errors, 5xx problems with their cause
// as warnings; 4xx answers are not logged.
func logFailure(logger *slog.Logger, c *gin.Context, err error, known bool) {
	switch {
	case !known:
		logger.ErrorContext(c.Request.Context(), "request failed", "err", err)
	case problem.From(err).Status >= 500:
		logger.WarnContext(c.Request.Context(), "request failed", "err", err)
	}
}

// decodeCheckout decodes the canonical (RFC 8785) checkout body member by
// member (httpbody.Members), so that each wrong type is reported at its
// own path ("items[0].quantity") and unknown members beside every other
// error.
func decodeCheckout(body []byte) (*checkout.Request, []problem.FieldError) {
	var in checkout.Request
	var errs []problem.FieldError
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
			errs = append(errs, problem.FieldError{Field: "items", Message: "must be an array of items"})
		}
		in.Items = make([]checkout.RequestItem, len(items))
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
			item.Decode("quantity", &in.Items[i].Quantity, fmt.Sprintf("must be an integer between 1 and %d", checkout.MaxQuantity))
		}
	}
	return &in, errs
}
