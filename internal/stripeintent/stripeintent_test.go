package stripeintent

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRules: each rule names exactly the statuses Stripe's documentation
// gives it.
func TestRules(t *testing.T) {
	t.Parallel()
	var moves, final, cancelable []Status
	for _, s := range All() {
		require.True(t, s.Valid())
		if s.MovesMoney() {
			moves = append(moves, s)
		}
		if s.Final() {
			final = append(final, s)
		}
		if s.Cancelable() {
			cancelable = append(cancelable, s)
		}
	}
	require.Equal(t, []Status{Processing, RequiresCapture, Succeeded}, moves)
	require.Equal(t, []Status{Canceled, Succeeded}, final)
	require.Equal(t, []Status{RequiresPaymentMethod, RequiresConfirmation, RequiresAction, RequiresCapture}, cancelable)
	for _, s := range cancelable {
		require.False(t, s.Final(), "%s: a final PaymentIntent cannot be canceled", s)
	}
	require.False(t, Status("paid").Valid())
}
