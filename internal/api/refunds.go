package api

import (
	"log/slog"

	"github.com/gin-gonic/gin"

	"github.com/onceonly/checkout/internal/httpbody"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/problem"
	"github.com/onceonly/checkout/internal/refunds"
)

// refundHandler serves the refund endpoint: it decodes the request into a
// refunds.RefundCommand and writes its answer.
type refundHandler struct {
	Service *refunds.Service
	Logger  *slog.Logger
}

// Register mounts POST /v1/orders/:id/refunds on r, guarded by gateway
// under its own route scope (refunds.Route). Both fields are optional, so
// an empty body (with or without a Content-Type) is the object {}: a
// refund of the rest, as a cancel's empty body is.
func (h *refundHandler) Register(r gin.IRoutes, gateway *idempotency.Gateway) {
	r.POST("/v1/orders/:id/refunds", gateway.Middleware(refunds.Route, idempotency.EmptyBodyIsObject), h.create)
}

func (h *refundHandler) create(c *gin.Context) {
	req := idempotency.RequestOf(c)
	in, inputErrs := decodeRefund(req.Body)
	resp, replayed, err := h.Service.Refund(c.Request.Context(), refunds.RefundCommand{
		Scope: req.Scope, Fingerprint: req.Fingerprint, Owner: req.Owner,
		OrderID: c.Param("id"), Input: in, InputErrors: inputErrs,
	})
	if err != nil {
		logFailure(h.Logger, c, err, req.Fail(c.Writer, err))
		return
	}
	req.Respond(c.Writer, resp, replayed)
}

// decodeRefund decodes the canonical (RFC 8785) refund body member by
// member (httpbody.Members), so that a wrong type is reported at its field
// and unknown members are errors too. A null member is as if absent.
func decodeRefund(body []byte) (*refunds.Request, []problem.FieldError) {
	var in refunds.Request
	var errs []problem.FieldError
	top, ok := httpbody.Object(body, "", "must be a JSON object", &errs)
	if !ok {
		return &in, errs
	}
	top.Unknown("amount", "reason")
	top.OmitNulls()
	if _, ok := top.Get("amount"); ok {
		var n int64
		if top.Decode("amount", &n, "must be a positive integer (minor units)") {
			in.Amount = &n
		}
	}
	top.String("reason", &in.Reason)
	return &in, errs
}
