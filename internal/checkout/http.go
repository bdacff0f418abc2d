package checkout

import (
	"encoding/json"
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

// decodeRequest decodes the canonical (RFC 8785) checkout body member by
// member, so that each wrong type is reported at its own path
// ("items[0].quantity") in the API's words, and unknown members (matched
// exactly, unlike encoding/json's case-insensitive matching) are reported
// beside every other error rather than instead of them.
func decodeRequest(body []byte) (*Request, []FieldError) {
	var in Request
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return &in, []FieldError{{Field: "", Message: "must be a JSON object"}}
	}
	errs := unknownFields("", top, "email", "items", "payment_method")
	decodeString(top, "email", "email", &in.Email, &errs)
	decodeString(top, "payment_method", "payment_method", &in.PaymentMethod, &errs)
	if raw, ok := top["items"]; ok {
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil || items == nil {
			errs = append(errs, FieldError{Field: "items", Message: "must be an array of items"})
		}
		in.Items = make([]RequestItem, len(items))
		for i, rawItem := range items {
			path := fmt.Sprintf("items[%d]", i)
			var item map[string]json.RawMessage
			if err := json.Unmarshal(rawItem, &item); err != nil || item == nil {
				errs = append(errs, FieldError{Field: path, Message: `must be an object like {"sku":"sku_tee","quantity":1}`})
				continue
			}
			errs = append(errs, unknownFields(path+".", item, "sku", "quantity")...)
			decodeString(item, "sku", path+".sku", &in.Items[i].SKU, &errs)
			if q, ok := item["quantity"]; ok {
				// The canonical form writes every integral number as an
				// integer (2.0 and 2e0 are 2), so this accepts exactly
				// what the fingerprint treats as the same request.
				if err := json.Unmarshal(q, &in.Items[i].Quantity); err != nil {
					errs = append(errs, FieldError{Field: path + ".quantity", Message: fmt.Sprintf("must be an integer between 1 and %d", MaxQuantity)})
				}
			}
		}
	}
	return &in, errs
}

// decodeString decodes obj[name], when present, into dst, or notes that it
// is not a string.
func decodeString(obj map[string]json.RawMessage, name, path string, dst *string, errs *[]FieldError) {
	raw, ok := obj[name]
	if !ok {
		return // absent: validate says it is required
	}
	if err := json.Unmarshal(raw, dst); err != nil || string(raw) == "null" {
		*errs = append(*errs, FieldError{Field: path, Message: "must be a string"})
	}
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
