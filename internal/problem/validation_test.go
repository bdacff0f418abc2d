package problem

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestValidation: the one validation_error lists its fields in field order
// (stable for equal fields), at most MaxFieldErrors, with a detail that
// counts them all, and renders as 400 without touching its argument.
func TestValidation(t *testing.T) {
	t.Parallel()
	in := []FieldError{{Field: "items[0].sku", Message: "b"}, {Field: "email", Message: "a"}, {Field: "email", Message: "c"}}
	e := Validation(in)
	require.Equal(t, []FieldError{{Field: "email", Message: "a"}, {Field: "email", Message: "c"}, {Field: "items[0].sku", Message: "b"}},
		e.Extensions["errors"])
	require.Equal(t, "items[0].sku", in[0].Field, "the caller's slice is not reordered")
	p := e.Problem()
	require.Equal(t, http.StatusBadRequest, p.Status)
	require.Equal(t, string(CodeValidation), p.Code)

	many := make([]FieldError, MaxFieldErrors+1)
	for i := range many {
		many[i] = FieldError{Field: fmt.Sprintf("f%03d", i)}
	}
	e = Validation(many)
	require.Len(t, e.Extensions["errors"], MaxFieldErrors)
	require.Contains(t, e.Detail, fmt.Sprint(MaxFieldErrors+1))
}
