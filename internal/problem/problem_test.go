package problem_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/problem"
)

func TestWrite(t *testing.T) {
	t.Parallel()
	p := &problem.Problem{Status: 409, Code: "idempotency_key_in_use", Title: "In use", Detail: "Later.", RetryAfter: 1}
	e := problem.New(problem.CodeIdempotencyKeyInUse, "Later.")
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		known  bool
	}{
		{"a problem", p, 409, "idempotency_key_in_use", true},
		{"a wrapped problem", fmt.Errorf("ctx: %w", p), 409, "idempotency_key_in_use", true},
		{"a coded error", e, 409, "idempotency_key_in_use", true},
		{"a wrapped coded error", fmt.Errorf("ctx: %w", e), 409, "idempotency_key_in_use", true},
		{"a coded error wrapping its cause", problem.Wrap(e, errors.New("db down")), 409, "idempotency_key_in_use", true},
		{"the credentials variant answers with its own status", problem.New(problem.CodePaymentProviderCredentials, ""), 503, "payment_provider_unavailable", true},
		{"a code the table lacks is a generic 500", problem.New("no_such_code", "secret detail"), 500, "internal", false},
		{"anything else is a generic 500", errors.New("secret detail"), 500, "internal", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			require.Equal(t, tc.known, problem.Write(w, tc.err))
			require.Equal(t, tc.status, w.Code)
			require.Equal(t, problem.ContentType, w.Header().Get("Content-Type"))
			var body map[string]any
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
			require.Equal(t, tc.code, body["code"])
			require.EqualValues(t, tc.status, body["status"])
			require.Equal(t, "https://checkout.local/problems/"+tc.code, body["type"])
			require.NotEmpty(t, body["title"])
			require.NotContains(t, w.Body.String(), "secret detail")
			require.NotContains(t, w.Body.String(), "db down")
		})
	}
	w := httptest.NewRecorder()
	problem.Write(w, p)
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	w = httptest.NewRecorder()
	problem.Write(w, problem.Wrap(e, errors.New("db down")))
	require.Equal(t, "1", w.Header().Get("Retry-After"), "the code's default")
	w = httptest.NewRecorder()
	problem.Write(w, e.WithRetryAfter(7))
	require.Equal(t, "7", w.Header().Get("Retry-After"), "the error's own")
	require.ErrorIs(t, problem.Wrap(e, errors.New("db down")), e, "a wrapped error is still e")
}

func TestExtensions(t *testing.T) {
	t.Parallel()
	base := problem.New(problem.CodeCardDeclined, "")
	p := base.With("order_id", "ord_1").With("status", 999).Problem()
	var body map[string]any
	require.NoError(t, json.Unmarshal(p.Body(), &body))
	require.Equal(t, "ord_1", body["order_id"])
	require.Equal(t, "Card declined", body["title"])
	require.EqualValues(t, 402, body["status"], "an extension never overrides a standard member")
	require.NotContains(t, string(p.Body()), `"detail"`, "no empty detail")
	require.Nil(t, base.Extensions, "With copies")
}
