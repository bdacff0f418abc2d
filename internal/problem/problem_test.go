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
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		known  bool
	}{
		{"a problem", p, 409, "idempotency_key_in_use", true},
		{"a wrapped problem", fmt.Errorf("ctx: %w", p), 409, "idempotency_key_in_use", true},
		{"a problem wrapping its cause", problem.Wrap(p, errors.New("db down")), 409, "idempotency_key_in_use", true},
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
}

func TestExtensions(t *testing.T) {
	t.Parallel()
	base := problem.New(402, "card_declined", "Card declined", "")
	p := base.With("order_id", "ord_1").With("status", 999)
	var body map[string]any
	require.NoError(t, json.Unmarshal(p.Body(), &body))
	require.Equal(t, "ord_1", body["order_id"])
	require.EqualValues(t, 402, body["status"], "an extension never overrides a standard member")
	require.NotContains(t, string(p.Body()), `"detail"`, "no empty detail")
	require.Nil(t, base.Extensions, "With copies")
}
