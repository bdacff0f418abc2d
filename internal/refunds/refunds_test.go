package refunds

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/stripestep"
)

// TestValidate: the checks of a decoded refund body; the decoding itself is
// internal/api's (TestDecodeRefund), whose errors validate does not repeat.
func TestValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		in      Request
		decoded []FieldError
		fields  []string
	}{
		{"empty: the rest", Request{}, nil, nil},
		{"amount and reason", Request{Amount: ptr(1000), Reason: "duplicate"}, nil, nil},
		{"zero", Request{Amount: ptr(0)}, nil, []string{"amount"}},
		{"negative", Request{Amount: ptr(-1)}, nil, []string{"amount"}},
		{"unknown reason", Request{Reason: "changed_mind"}, nil, []string{"reason"}},
		{"a decoded error is not checked again", Request{Amount: ptr(0)},
			[]FieldError{{Field: "amount", Message: "must be a positive integer (minor units)"}}, []string{"amount"}},
		{"unknown member kept", Request{Amount: ptr(1)}, []FieldError{{Field: "currency"}}, []string{"currency"}},
		{"not an object: nothing else", Request{Reason: "x"}, []FieldError{{Field: ""}}, []string{""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var fields []string
			for _, e := range tc.in.validate(tc.decoded) {
				fields = append(fields, e.Field)
			}
			require.Equal(t, tc.fields, fields)
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
