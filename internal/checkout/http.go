package checkout

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/problem"
)

// Handler serves the checkout API.
type Handler struct {
	Service *Service
	Logger  *slog.Logger
	// Tenant returns the authenticated tenant of a request.
	Tenant func(*gin.Context) string
}

// Register mounts the routes on r; gateway guards POST /v1/checkouts.
//
//	POST /v1/checkouts       create, resume or replay a checkout
//	GET  /v1/orders/:id      the tenant's order with its notifications
//	GET  /v1/products        the catalog with current stock
func (h *Handler) Register(r gin.IRoutes, gateway *idempotency.Gateway) {
	r.POST("/v1/checkouts", gateway.Middleware(Route), h.createCheckout)
	r.GET("/v1/orders/:id", h.getOrder)
	r.GET("/v1/products", h.listProducts)
}

func (h *Handler) createCheckout(c *gin.Context) {
	req := idempotency.RequestOf(c)
	in, inputErrs := decodeRequest(req.Body)
	resp, replayed, err := h.Service.Checkout(c.Request.Context(), req, in, inputErrs)
	if err != nil {
		h.logFailure(c, err, req.Fail(c.Writer, err))
		return
	}
	req.Respond(c.Writer, resp, replayed)
}

func (h *Handler) getOrder(c *gin.Context) {
	view, err := h.Service.Order(c.Request.Context(), h.Tenant(c), c.Param("id"))
	if err != nil {
		h.logFailure(c, err, problem.Write(c.Writer, err))
		return
	}
	c.JSON(http.StatusOK, view)
}

func (h *Handler) listProducts(c *gin.Context) {
	ps, err := h.Service.Products(c.Request.Context())
	if err != nil {
		h.logFailure(c, err, problem.Write(c.Writer, err))
		return
	}
	c.JSON(http.StatusOK, gin.H{"data": ps})
}

// logFailure logs an error once: unknown errors (answered 500) as errors,
// 5xx problems with their cause as warnings; 4xx answers are not logged.
func (h *Handler) logFailure(c *gin.Context, err error, known bool) {
	switch {
	case !known:
		h.Logger.ErrorContext(c.Request.Context(), "request failed", "err", err)
	case problem.From(err).Status >= 500:
		h.Logger.WarnContext(c.Request.Context(), "request failed", "err", err)
	}
}

// decodeRequest decodes a checkout body strictly: unknown members (names
// are matched exactly, unlike encoding/json's case-insensitive matching) and
// wrong types become field errors. The body is already known to be JSON.
func decodeRequest(body []byte) (*Request, []FieldError) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return &Request{}, []FieldError{{Field: "", Message: "must be a JSON object"}}
	}
	errs := unknownFields("", top, "email", "items", "payment_method")
	var items []map[string]json.RawMessage
	if json.Unmarshal(top["items"], &items) == nil {
		for i, it := range items {
			errs = append(errs, unknownFields(fmt.Sprintf("items[%d].", i), it, "sku", "quantity")...)
		}
	}
	var in Request
	if err := json.Unmarshal(body, &in); err != nil {
		field, msg := "", "has the wrong type"
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			field, msg = typeErr.Field, fmt.Sprintf("must be of type %s", typeErr.Type)
		}
		errs = append(errs, FieldError{Field: field, Message: msg})
	}
	return &in, errs
}

// unknownFields returns an error for each member of obj not in known, in
// name order.
func unknownFields(prefix string, obj map[string]json.RawMessage, known ...string) []FieldError {
	var errs []FieldError
	for _, name := range slices.Sorted(maps.Keys(obj)) {
		if !slices.Contains(known, name) {
			errs = append(errs, FieldError{Field: prefix + name, Message: "is not a known field"})
		}
	}
	return errs
}
