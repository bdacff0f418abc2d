package api

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDecodeRefund: the refund body is decoded member by member, each
// wrong type reported at its field and unknown members beside it; the
// checks of the decoded values are refunds' (refunds.TestValidate).
func TestDecodeRefund(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		body   string
		amount *int64
		reason string
		fields []string
	}{
		{"empty: the rest", `{}`, nil, "", nil},
		{"amount and reason", `{"amount":1000,"reason":"duplicate"}`, ptr(1000), "duplicate", nil},
		{"nulls are absent", `{"amount":null,"reason":null}`, nil, "", nil},
		{"zero is decoded; refunds refuses it", `{"amount":0}`, ptr(0), "", nil},
		{"string amount", `{"amount":"5"}`, nil, "", []string{"amount"}},
		{"fraction", `{"amount":1.5}`, nil, "", []string{"amount"}},
		{"reason not a string", `{"reason":3}`, nil, "", []string{"reason"}},
		{"unknown member", `{"amount":1,"currency":"eur"}`, ptr(1), "", []string{"currency"}},
		{"not an object", `[1]`, nil, "", []string{""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in, decoded := decodeRefund([]byte(tc.body))
			var fields []string
			for _, e := range decoded {
				fields = append(fields, e.Field)
			}
			require.Equal(t, tc.fields, fields)
			require.Equal(t, tc.amount, in.Amount)
			require.Equal(t, tc.reason, in.Reason)
		})
	}
}

func ptr(n int64) *int64 { return &n }
