package refunds

import (
	"slices"
	"strings"

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
type FieldError = problem.FieldError

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
		errs = append(errs, FieldError{Field: "amount", Message: "must be a positive integer (minor units)"})
	}
	if r.Reason != "" && !slices.Contains(Reasons, r.Reason) && !bad["reason"] {
		errs = append(errs, FieldError{Field: "reason", Message: "must be one of " + strings.Join(Reasons, ", ")})
	}
	return errs
}
