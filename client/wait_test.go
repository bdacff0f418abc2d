package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/client"
)

// orderIn is orderJSON with status s.
func orderIn(s client.OrderStatus) string {
	return strings.Replace(orderJSON, `"status":"paid"`, `"status":"`+string(s)+`"`, 1)
}

// TestWaitOrderFollowsUntilSettled: a 202 order read as requires_action,
// then payment_unknown, then paid: WaitOrder reads it three times, waits
// between the reads with a growing backoff, and returns the paid order.
func TestWaitOrderFollowsUntilSettled(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t,
		reply{status: 200, body: orderIn(client.OrderRequiresAction)},
		reply{status: 200, body: orderIn(client.OrderPaymentUnknown)},
		reply{status: 200, body: orderIn(client.OrderPaid)})
	c, s := setup(t, f, client.RetryPolicy{})
	r, err := c.WaitOrder(ctx(t), "ord_0123456789abcdef0123456789abcdef")
	require.NoError(t, err)
	require.Equal(t, client.OrderPaid, r.Order.Status)
	require.Len(t, f.requests(), 3)
	for _, q := range f.requests() {
		require.Equal(t, "GET", q.method)
		require.Equal(t, "/v1/orders/ord_0123456789abcdef0123456789abcdef", q.path)
	}
	require.Len(t, s.waits, 2, "a wait between reads")
	require.Greater(t, s.waits[0], time.Duration(0))
}

// TestWaitOrderStopsWithItsContext: an order that stays requires_action
// returns, when ctx ends, the last order read and an error that is
// ctx.Err().
func TestWaitOrderStopsWithItsContext(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, reply{status: 200, body: orderIn(client.OrderRequiresAction)})
	ctx, cancel := context.WithCancel(context.Background())
	reads := 0
	// The third wait cancels: no clock involved.
	c, _ := setup(t, f, client.RetryPolicy{Sleep: func(ctx context.Context, _ time.Duration) error {
		if reads++; reads == 3 {
			cancel()
		}
		return ctx.Err()
	}})
	r, err := c.WaitOrder(ctx, "ord_0123456789abcdef0123456789abcdef")
	require.ErrorIs(t, err, context.Canceled)
	require.NotNil(t, r)
	require.Equal(t, client.OrderRequiresAction, r.Order.Status)
	require.Len(t, f.requests(), 3)
}

// TestWaitOrderReturnsAFinalError: an unknown order is ErrNotFound at
// once, with no wait.
func TestWaitOrderReturnsAFinalError(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(t, reply{status: 404, code: "not_found"})
	c, s := setup(t, f, client.RetryPolicy{})
	r, err := c.WaitOrder(ctx(t), "ord_nope")
	require.ErrorIs(t, err, client.ErrNotFound)
	require.Nil(t, r)
	require.Empty(t, s.waits)
}

// TestSettled: the statuses an order reaches its outcome in.
func TestSettled(t *testing.T) {
	t.Parallel()
	settled := map[client.OrderStatus]bool{
		client.OrderPendingPayment: false, client.OrderRequiresAction: false, client.OrderPaymentUnknown: false,
		client.OrderPaid: true, client.OrderPaymentFailed: true, client.OrderCanceled: true,
		client.OrderPartiallyRefunded: true, client.OrderRefunded: true,
	}
	for s, want := range settled {
		require.Equal(t, want, s.Settled(), "%s", s)
	}
}
