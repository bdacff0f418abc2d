package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// TestWebhooksSettle3DSecureDuplicatedAndShuffled: 3D Secure checkouts
// completed by the emulator's challenge endpoint (most authenticated, some
// failed), with the emulator delivering every event twice and shuffled in
// windows, and a first attempt dropped now and then. The worker's
// reconciler is slowed to once an hour, so only the webhooks can settle the
// orders. Every order converges to Stripe's state within a bound; each
// paid order gets one email, each failed one none; duplicates are absorbed
// by the inbox.
func TestWebhooksSettle3DSecureDuplicatedAndShuffled(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{
		Webhooks: true,
		Env:      map[string]map[string]string{"worker": {"RECONCILER_INTERVAL": "1h"}},
	})
	s.HookFault(
		stripeemu.HookFault{Kind: stripeemu.HookDuplicate},           // every event twice
		stripeemu.HookFault{Kind: stripeemu.HookShuffle, Window: 4},  // reordered in windows of 4
		stripeemu.HookFault{Kind: stripeemu.HookDropFirst, Count: 3}, // three first attempts lost
		stripeemu.HookFault{Kind: stripeemu.HookDelay, Count: 2, Delay: 300 * time.Millisecond},
	)

	ctx := testCtx(t, 2*time.Minute)
	c := s.DirectClient()
	const n = 8
	type pending struct{ order, pi string }
	orders := make([]pending, n)
	for i := range orders {
		body := stack.TeeBody(fmt.Sprintf("buyer%d@example.com", i), 1)
		body.PaymentMethod = "pm_card_authenticationRequired"
		r := last(untilFinal(ctx, t, c, fmt.Sprintf("wh-3ds-%d", i), body))
		require.Equal(t, 202, r.Status, "%s %s", r, r.Body)
		var o stack.Order
		require.NoError(t, json.Unmarshal(r.Body, &o))
		require.Equal(t, "requires_action", o.Status)
		orders[i] = pending{o.ID, o.Payment.PaymentIntentID}
	}
	// The customers: three of eight fail their challenge.
	for i, p := range orders {
		s.Authenticate(p.pi, i%3 != 2)
	}

	// Convergence: every order as Stripe says, within a bound (resends
	// after a dropped attempt come within a second or two).
	want := map[string]string{}
	for _, pi := range s.PaymentIntents() {
		want[pi.Metadata["order_id"]] = stack.OrderForStripe(pi.Status)
	}
	eventually(t, 30*time.Second, func() bool {
		for _, p := range orders {
			if s.OrderStatus(p.order) != want[p.order] {
				return false
			}
		}
		return true
	}, "orders converge to Stripe's state")
	s.ClearHookFaults() // releases a shuffle window still held

	require.NoError(t, s.Quiesce(30*time.Second))
	paid := 0
	for i, p := range orders {
		require.NotEmpty(t, want[p.order], "order %d: Stripe's state is final", i)
		require.Equal(t, want[p.order], s.OrderStatus(p.order), "order %d", i)
		require.Equal(t, 1, s.Intents(p.order), "one PaymentIntent for order %d", i)
		if want[p.order] == "paid" {
			paid++
			require.Equal(t, 1, s.Emails(p.order), "one email for paid order %d", i)
		} else {
			require.Equal(t, 0, s.Emails(p.order), "no email for failed order %d", i)
		}
	}
	require.Equal(t, n-n/3, paid)

	// The faults did happen, and the inbox absorbed the duplicates.
	log := s.Webhooks()
	dup, dropped := 0, 0
	for _, a := range log.Attempts {
		if a.Duplicate {
			dup++
		}
		if a.Dropped {
			dropped++
		}
	}
	require.Positive(t, dup, "the emulator sent duplicates")
	// How many of the three drops were used depends on what the shuffle
	// still held when the faults were cleared; the first delivery was one.
	require.Positive(t, dropped, "first attempts dropped and resent")
	applied, err := stack.Metric(s.APIURL+"/metrics", "checkout_stripe_webhooks_total", `outcome="applied"`)
	require.NoError(t, err)
	require.Equal(t, float64(n), applied, "one applied event per order")
	duplicates, err := stack.Metric(s.APIURL+"/metrics", "checkout_stripe_webhooks_total", `outcome="duplicate"`)
	require.NoError(t, err)
	require.Positive(t, duplicates)
	require.Equal(t, 0, s.Unpublished())
}
