package problem

import (
	"fmt"
	"slices"
	"strings"
)

// FieldError names one invalid member of a request body by its path
// ("items[0].quantity"; "" for the body itself), with what is wrong in the
// API's words. It is what a validation_error lists under "errors".
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// MaxFieldErrors caps the errors one validation_error lists, so that a
// body of thousands of unknown members cannot make a response larger than
// itself.
const MaxFieldErrors = 50

// Validation returns the validation_error (400) listing errs in field
// order, at most MaxFieldErrors of them. It is never stored under a key:
// the same key may be sent again with the body fixed. Every domain package
// builds its validation_error here, so that one rule orders and caps them.
func Validation(errs []FieldError) *Error {
	errs = slices.Clone(errs)
	slices.SortStableFunc(errs, func(a, b FieldError) int { return strings.Compare(a.Field, b.Field) })
	detail := "The request body has invalid fields; see errors."
	if len(errs) > MaxFieldErrors {
		detail = fmt.Sprintf("The request body has %d invalid fields; errors lists the first %d.", len(errs), MaxFieldErrors)
		errs = errs[:MaxFieldErrors]
	}
	return New(CodeValidation, detail).With("errors", errs)
}
