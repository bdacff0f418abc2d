package api_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/problem"
)

// TestRefundValidationErrorIsCapped: a refund body with more invalid
// members than problem.MaxFieldErrors is answered with the one
// validation_error checkout answers too: the first MaxFieldErrors in field
// order and a detail counting them all, so the answer is never larger than
// the request; nothing is stored and nothing refunded.
func TestRefundValidationErrorIsCapped(t *testing.T) {
	t.Parallel()
	h := setup(t)
	orderID, pi := h.paidOrder()

	const n = problem.MaxFieldErrors + 10
	members := make([]string, n)
	for i := range members {
		members[i] = fmt.Sprintf(`"x%03d":1`, i)
	}
	r := h.refund(orderID, "too-many", "{"+strings.Join(members, ",")+"}")
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	p := decodeProblem(t, r)
	require.Equal(t, "validation_error", p.Code)
	require.Len(t, p.Errors, problem.MaxFieldErrors)
	require.Equal(t, "x000", p.Errors[0].Field)
	require.Contains(t, p.Detail, fmt.Sprint(n))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM idempotency_keys WHERE key = 'too-many'`), "a validation_error is not stored")
	require.Empty(t, h.stripeRefunds(pi))
}
