package storefront_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/client"
	"github.com/onceonly/checkout/internal/stripeemu"
)

// testRetry is the storefront's retry policy in these tests: a Pay gives
// up after 3s of lost answers instead of DefaultCheckoutWait.
var testRetry = client.RetryPolicy{MaxElapsed: 3 * time.Second, AttemptTimeout: 2 * time.Second, MaxDelay: 500 * time.Millisecond}

// doubleClick sends a real double click to the element: two presses, the
// second with clickCount 2, so the page gets two click events (and a
// dblclick), as from a person's finger.
func doubleClick(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	xy := eval[[]float64](t, ctx, `(() => { const r = document.getElementById("`+id+`").getBoundingClientRect(); return [r.x + r.width/2, r.y + r.height/2]; })()`)
	do(t, ctx, chromedp.MouseClickXY(xy[0], xy[1]), chromedp.MouseClickXY(xy[0], xy[1], chromedp.ClickCount(2)))
}

// TestDoubleClickPaysOnce: a double click on Pay sends two requests with
// the purchase's one key; the API executes the first (201) and the second
// waits (409 idempotency_key_in_use) and gets the replay: one order, one
// charge at the emulator, and the panel shows both Pays and the replay.
// With a key made per click, the second Pay would be a second order and
// a second charge.
func TestDoubleClickPaysOnce(t *testing.T) {
	e := setup(t)
	ctx := e.tab(t, time.Minute)
	buyer := email("double-click")
	e.toCheckout(t, ctx, buyer, "pm_card_visa")
	// Stripe slow, so that the first Pay is still in flight when the second
	// click lands, however busy the machine: on a loaded CI runner the
	// whole first Pay once finished between the two clicks.
	e.st.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, Before: time.Second})
	t.Cleanup(e.st.ClearFaults)
	doubleClick(t, ctx, "pay")
	until(t, ctx, 20*time.Second, `document.getElementById("order-link")`)

	_, rows := panel(t, ctx)
	pays := map[string]bool{}
	var first, replayed int
	for _, r := range rows {
		pays[r.Pay] = true
		if strings.HasPrefix(r.Answer, "201") && r.Replayed == "no" {
			first++
		}
		if strings.HasPrefix(r.Answer, "201") && r.Replayed == "yes" {
			replayed++
		}
	}
	require.Len(t, pays, 2, "two Pays were sent: %+v", rows)
	require.Equal(t, 1, first, "one first execution: %+v", rows)
	require.Equal(t, 1, replayed, "the other Pay got the replay: %+v", rows)

	orders := e.orders(t, buyer)
	require.Len(t, orders, 1, "one order")
	pis := e.intents(orders[0])
	require.Len(t, pis, 1, "one PaymentIntent")
	require.Equal(t, "succeeded", pis[0].Status, "one charge")
	require.Equal(t, "paid", e.orderStatus(t, orders[0]))
	href := eval[string](t, ctx, `document.getElementById("order-link").getAttribute("href")`)
	require.Equal(t, "/orders/"+orders[0], href)
}

// TestReloadAfterLostAnswer: the api's answer to Pay is lost (toxiproxy
// resets the connection as the answer starts, on every retry), so the
// page says the outcome is unknown; the customer reloads the page and
// presses Pay again: the key kept in sessionStorage makes it the same
// purchase, answered by the replay of the order the first Pay created.
// With a key made per page load, the reload would make a second order.
func TestReloadAfterLostAnswer(t *testing.T) {
	e := setup(t)
	ctx := e.tab(t, time.Minute)
	buyer := email("lost-answer")
	e.toCheckout(t, ctx, buyer, "pm_card_visa")
	key := eval[string](t, ctx, `document.getElementById("browser-key").textContent`)

	require.NoError(t, e.apiLink.DropAnswers())
	click(t, ctx, "#pay")
	until(t, ctx, 20*time.Second, `document.getElementById("result").textContent.includes("we do not know")`)
	e.apiLink.Heal()
	orders := e.orders(t, buyer)
	require.Len(t, orders, 1, "the api executed the lost Pay")
	_, rows := panel(t, ctx)
	require.NotEmpty(t, rows)
	for _, r := range rows {
		require.True(t, strings.HasPrefix(r.Answer, "no answer"), "every answer was lost: %+v", rows)
	}

	do(t, ctx, chromedp.Reload())
	e.fillCheckout(t, ctx, buyer, "pm_card_visa")
	again, lost := panel(t, ctx)
	click(t, ctx, "#pay")
	until(t, ctx, 20*time.Second, `document.getElementById("order-link")`)

	require.Equal(t, orders, e.orders(t, buyer), "the same one order")
	pis := e.intents(orders[0])
	require.Len(t, pis, 1)
	require.Equal(t, "succeeded", pis[0].Status, "one charge")
	require.Equal(t, key, again, "the reload kept the purchase's key")
	require.Equal(t, rows, lost, "and its panel")
	_, rows = panel(t, ctx)
	last := rows[len(rows)-1]
	require.True(t, strings.HasPrefix(last.Answer, "201"), "%+v", rows)
	require.Equal(t, "yes", last.Replayed, "the order the lost Pay made, replayed")
	href := eval[string](t, ctx, `document.getElementById("order-link").getAttribute("href")`)
	require.Equal(t, "/orders/"+orders[0], href)
}

// TestThreeDSecureRedirect: a card that needs 3D Secure sends the customer
// to the order page, then to the emulator's challenge page (Stripe's
// redirect flow, through the checkout's return_url); completing it brings
// the customer back to the order page, which follows the order to paid
// (and its email); failing it, to payment_failed with nothing charged.
func TestThreeDSecureRedirect(t *testing.T) {
	e := setup(t)
	for _, tc := range []struct {
		button, wantStatus, wantPI, wantText, wantReason string
	}{
		{"approve", "paid", "succeeded", "Paid", ""},
		{"fail", "payment_failed", "canceled", "Payment failed", "3D Secure check was not passed"},
	} {
		t.Run(tc.button, func(t *testing.T) {
			ctx := e.tab(t, time.Minute)
			buyer := email("3ds-" + tc.button)
			e.toCheckout(t, ctx, buyer, "pm_card_authenticationRequired")
			click(t, ctx, "#pay")
			until(t, ctx, 20*time.Second, `document.getElementById("authenticate") && !document.getElementById("waiting").hidden`)
			orders := e.orders(t, buyer)
			require.Len(t, orders, 1)
			require.Equal(t, "requires_action", e.orderStatus(t, orders[0]))

			click(t, ctx, "#authenticate")
			until(t, ctx, 10*time.Second, `document.getElementById("`+tc.button+`")`)
			require.True(t, strings.HasPrefix(eval[string](t, ctx, `location.href`), e.st.EmulatorURL+"/3d_secure_2/hosted?"),
				"the emulator's challenge page")
			click(t, ctx, "#"+tc.button)
			until(t, ctx, 30*time.Second, `document.getElementById("order-status") && document.getElementById("order-status").dataset.status === "`+tc.wantStatus+`"`)
			require.Equal(t, e.shopURL+"/orders/"+orders[0], eval[string](t, ctx, `location.href`), "back on the order page")
			// In words: the status, why the payment failed, the product.
			require.Equal(t, tc.wantText, eval[string](t, ctx, `document.getElementById("order-status").textContent`))
			reason := eval[string](t, ctx, `document.getElementById("reason").hidden ? "" : document.getElementById("reason").textContent`)
			if tc.wantReason == "" {
				require.Empty(t, reason)
			} else {
				require.Contains(t, reason, tc.wantReason)
			}
			page := eval[string](t, ctx, `document.querySelector("main").innerText`)
			require.Contains(t, page, "T-shirt × 1")
			require.NotContains(t, page, "sku_tee")
			require.NotContains(t, page, "pi_", "no Stripe ids for the shopper")
			if tc.wantStatus == "paid" {
				until(t, ctx, 30*time.Second, `document.getElementById("email").textContent.includes("email sent")`)
			}

			require.Equal(t, orders, e.orders(t, buyer))
			pis := e.intents(orders[0])
			require.Len(t, pis, 1)
			require.Equal(t, tc.wantPI, pis[0].Status)
			require.Equal(t, tc.wantStatus, e.orderStatus(t, orders[0]))
		})
	}
}

// TestCancelWhileWaiting: the customer cancels an order that waits for 3D
// Secure from its page: the order is canceled, its PaymentIntent canceled
// at Stripe (nothing charged), and the page stops offering the challenge.
func TestCancelWhileWaiting(t *testing.T) {
	e := setup(t)
	ctx := e.tab(t, time.Minute)
	buyer := email("cancel")
	e.toCheckout(t, ctx, buyer, "pm_card_authenticationRequired")
	click(t, ctx, "#pay")
	until(t, ctx, 20*time.Second, `document.getElementById("cancel") && !document.getElementById("waiting").hidden`)
	click(t, ctx, "#cancel")
	until(t, ctx, 20*time.Second, `document.getElementById("order-status") && document.getElementById("order-status").dataset.status === "canceled"`)
	require.True(t, eval[bool](t, ctx, `document.getElementById("waiting").hidden`))
	require.Equal(t, "Canceled", eval[string](t, ctx, `document.getElementById("order-status").textContent`))
	require.Contains(t, eval[string](t, ctx, `document.getElementById("reason").textContent`), "You canceled the order")

	orders := e.orders(t, buyer)
	require.Len(t, orders, 1)
	require.Equal(t, "canceled", e.orderStatus(t, orders[0]))
	pis := e.intents(orders[0])
	require.Len(t, pis, 1)
	require.Equal(t, "canceled", pis[0].Status, "nothing charged")
}
