package refunds

import (
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/problem"
)

// Request is the body of POST /v1/orders/{id}/refunds:
// {"amount": 1000, "reason": "requested_by_customer"}.
type Request struct {
	// Amount in minor units; nil refunds everything still refundable.
	Amount *int64 `json:"amount"`
	// Reason is one of Reasons, or empty.
	Reason string `json:"reason"`
}

// FieldError names one invalid field.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// ValidationError returns the 400 validation_error problem listing errs in
// field order. It is never stored: the same key may be sent again fixed.
func ValidationError(errs []FieldError) *problem.Error {
	errs = slices.Clone(errs)
	slices.SortStableFunc(errs, func(a, b FieldError) int { return strings.Compare(a.Field, b.Field) })
	return problem.New(problem.CodeValidation,
		"The request body has invalid fields; see errors.").With("errors", errs)
}

// validate checks the decoded request; decoded are the errors decoding
// found, whose fields are not checked again.
func (r *Request) validate(decoded []FieldError) []FieldError {
	errs := slices.Clone(decoded)
	bad := map[string]bool{}
	for _, e := range decoded {
		bad[e.Field] = true
	}
	if bad[""] {
		return errs
	}
	if r.Amount != nil && *r.Amount < 1 && !bad["amount"] {
		errs = append(errs, FieldError{"amount", "must be a positive integer (minor units)"})
	}
	if r.Reason != "" && !slices.Contains(Reasons, r.Reason) && !bad["reason"] {
		errs = append(errs, FieldError{"reason", "must be one of " + strings.Join(Reasons, ", ")})
	}
	return errs
}

// decodeRequest decodes the canonical (RFC 8785) body member by member, so
// that a wrong type is reported at its field and unknown members are
// errors too. A null member is as if absent.
func decodeRequest(body []byte) (*Request, []FieldError) {
	var in Request
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return &in, []FieldError{{Field: "", Message: "must be a JSON object"}}
	}
	var errs []FieldError
	for _, name := range slices.Sorted(maps.Keys(top)) {
		if name != "amount" && name != "reason" {
			errs = append(errs, FieldError{name, "is not a known field"})
		}
	}
	if raw, ok := top["amount"]; ok && string(raw) != "null" {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil {
			errs = append(errs, FieldError{"amount", "must be a positive integer (minor units)"})
		} else {
			in.Amount = &n
		}
	}
	if raw, ok := top["reason"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &in.Reason); err != nil {
			errs = append(errs, FieldError{"reason", "must be a string"})
		}
	}
	return &in, errs
}

// Handler serves the refund endpoint.
type Handler struct {
	Service *Service
	Logger  *slog.Logger
}

// Register mounts POST /v1/orders/:id/refunds on r, guarded by gateway
// under its own route scope (Route). Both fields are optional, so an empty
// body (with or without a Content-Type) is the object {}: a refund of the
// rest, as a cancel's empty body is.
func (h *Handler) Register(r gin.IRoutes, gateway *idempotency.Gateway) {
	r.POST("/v1/orders/:id/refunds", gateway.Middleware(Route, idempotency.EmptyBodyIsObject), h.create)
}

func (h *Handler) create(c *gin.Context) {
	req := idempotency.RequestOf(c)
	in, inputErrs := decodeRequest(req.Body)
	resp, replayed, err := h.Service.Refund(c.Request.Context(), req, c.Param("id"), in, inputErrs)
	if err != nil {
		known := req.Fail(c.Writer, err)
		switch {
		case !known:
			h.Logger.ErrorContext(c.Request.Context(), "refund failed", "err", err)
		case problem.From(err).Status >= 500:
			h.Logger.WarnContext(c.Request.Context(), "refund failed", "err", err)
		}
		return
	}
	req.Respond(c.Writer, resp, replayed)
}
