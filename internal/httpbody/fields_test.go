package httpbody_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/httpbody"
	"github.com/onceonly/checkout/internal/problem"
)

func TestMembers(t *testing.T) {
	t.Parallel()
	var errs []problem.FieldError
	_, ok := httpbody.Object([]byte(`null`), "items[0]", "must be an object", &errs)
	require.False(t, ok)
	require.Equal(t, []problem.FieldError{{Field: "items[0]", Message: "must be an object"}}, errs)

	errs = nil
	o, ok := httpbody.Object([]byte(`{"b":1,"a":"x","Name":"y","n":null,"q":2}`), "item", "must be an object", &errs)
	require.True(t, ok)
	o.Unknown("a", "n", "q")
	var a, n string
	var q int
	o.String("a", &a)
	o.String("n", &n)
	require.True(t, o.Decode("q", &q, "must be an integer"))
	require.False(t, o.Decode("absent", &q, "must be an integer"))
	require.Equal(t, "x", a)
	require.Equal(t, 2, q)
	require.Equal(t, []problem.FieldError{
		{Field: "item.Name", Message: "is not a known field"}, // exact names: not "name"
		{Field: "item.b", Message: "is not a known field"},
		{Field: "item.n", Message: "must be a string"},
	}, errs)

	errs = nil
	o, _ = httpbody.Object([]byte(`{"n":null}`), "", "", &errs)
	o.OmitNulls()
	o.String("n", &n)
	require.Empty(t, errs, "a null member omitted is as if absent")
}
