package refunds

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/stripestep"
)

func TestDecodeAndValidate(t *testing.T) {
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
		{"zero", `{"amount":0}`, ptr(0), "", []string{"amount"}},
		{"negative", `{"amount":-1}`, ptr(-1), "", []string{"amount"}},
		{"string amount", `{"amount":"5"}`, nil, "", []string{"amount"}},
		{"fraction", `{"amount":1.5}`, nil, "", []string{"amount"}},
		{"unknown reason", `{"reason":"changed_mind"}`, nil, "changed_mind", []string{"reason"}},
		{"reason not a string", `{"reason":3}`, nil, "", []string{"reason"}},
		{"unknown member", `{"amount":1,"currency":"eur"}`, ptr(1), "", []string{"currency"}},
		{"not an object", `[1]`, nil, "", []string{""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in, decoded := decodeRequest([]byte(tc.body))
			var fields []string
			for _, e := range in.validate(decoded) {
				fields = append(fields, e.Field)
			}
			require.Equal(t, tc.fields, fields)
			if tc.fields == nil {
				require.Equal(t, tc.amount, in.Amount)
				require.Equal(t, tc.reason, in.Reason)
			}
		})
	}
}

func TestOurStatusFollowsStripe(t *testing.T) {
	t.Parallel()
	for stripe, ours := range map[string]Status{
		"pending": StatusPending, "requires_action": StatusPending, "succeeded": StatusSucceeded,
		"failed": StatusFailed, "canceled": StatusFailed,
	} {
		require.Equal(t, ours, ourStatus(stripe), stripe)
	}
}

func TestAttemptKeyIsDerivedFromPersistedState(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ord_1/refund:rf_2/3", stripestep.Key("ord_1", stripestep.RefundStep("rf_2"), 3))
}

func ptr(n int64) *int64 { return &n }
