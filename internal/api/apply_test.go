package api_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/payments"
)

// TestApplyPaymentIntentRecordsInItsTransaction: the one "apply Stripe's
// state of a PaymentIntent" runs the caller's record (the webhook
// handler's inbox record) in the transaction that applies the change:
// when the record fails, the order stays where it was (Stripe's resend
// applies it later); when the record says the event was seen before,
// nothing is applied; otherwise record and change commit together.
func TestApplyPaymentIntentRecordsInItsTransaction(t *testing.T) {
	t.Parallel()
	h := setup(t)
	o := threeDS(t, h, "apply-record-1")
	c := payments.NewClient(payments.Config{APIBase: h.emuURL, SecretKey: "sk_test_123"}, nil, nil)
	_, err := h.emu.Authenticate(o.Payment.PaymentIntentID, true)
	require.NoError(t, err)
	succeeded, err := c.RetrievePaymentIntent(t.Context(), o.Payment.PaymentIntentID)
	require.NoError(t, err)

	lost := errors.New("the inbox insert failed")
	_, err = h.api.Service.ApplyPaymentIntent(t.Context(), succeeded, func(*gorm.DB) (bool, error) { return false, lost })
	require.ErrorIs(t, err, lost)
	require.Equal(t, string(orders.RequiresAction), h.order(o.ID).Status, "rolled back with the record")

	changed, err := h.api.Service.ApplyPaymentIntent(t.Context(), succeeded, func(*gorm.DB) (bool, error) { return false, nil })
	require.NoError(t, err)
	require.False(t, changed, "an event seen before applies nothing")
	require.Equal(t, string(orders.RequiresAction), h.order(o.ID).Status)

	var inTx int
	changed, err = h.api.Service.ApplyPaymentIntent(t.Context(), succeeded, func(tx *gorm.DB) (bool, error) {
		inTx++
		// The record's write and the change share tx: the order row is not
		// locked by another transaction here.
		return true, tx.Exec(`SELECT id FROM orders WHERE id = ? FOR UPDATE NOWAIT`, o.ID).Error
	})
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, 1, inTx)
	require.Equal(t, string(orders.Paid), h.order(o.ID).Status)
}
