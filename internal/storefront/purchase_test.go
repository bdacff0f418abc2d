package storefront_test

import (
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/storefront"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/testenv"
)

// payUntilDone presses Pay, as a shopper told "Pay again: it is safe"
// does, until the page links the order (or d passes).
func payUntilDone(t *testing.T, e *env, buyer string, ctxPay func(), done func() bool, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !done() {
		require.True(t, time.Now().Before(deadline), "no order link after %s; orders %v", d, e.orders(t, buyer))
		ctxPay()
		time.Sleep(time.Second)
	}
}

// TestStorefrontRestartDuringPay: the storefront dies (every connection
// closed, nothing kept) while a Pay waits for a slow Stripe, and comes
// back at the same address; the page, which got no answer, says Pay
// again is safe; the shopper presses it: the same stored request under
// the same key (the signed session cookie survived) is the same order,
// replayed: one order, one charge at the emulator. With sessions and
// purchases in the storefront's memory, the retry was "Your cart is
// empty" (final), and a new cart a second order and a second charge.
func TestStorefrontRestartDuringPay(t *testing.T) {
	e := setup(t)
	// A storefront of this test's own, which it kills and restarts.
	serve := func(addr string) *http.Server {
		shop, err := storefront.New(storefront.Config{APIURL: "http://" + e.apiLink.Addr(), TenantKey: "sk_test_acme", Retry: testRetry})
		require.NoError(t, err)
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err)
		srv := &http.Server{Handler: shop}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(shop.Wait)
		t.Cleanup(func() { _ = srv.Close() })
		return srv
	}
	addr := testenv.FreeAddr(t)
	first := serve(addr)
	mine := *e
	mine.shopURL = "http://" + addr

	ctx := e.tab(t, 2*time.Minute)
	buyer := email("restart")
	mine.toCheckout(t, ctx, buyer, "pm_card_visa")
	e.st.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, Before: 3 * time.Second})
	t.Cleanup(e.st.ClearFaults)
	click(t, ctx, "#pay")
	deadline := time.Now().Add(10 * time.Second)
	for len(e.orders(t, buyer)) == 0 {
		require.True(t, time.Now().Before(deadline), "the Pay reached the api")
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, first.Close()) // the crash: the Pay in flight is never answered
	until(t, ctx, 10*time.Second, `document.getElementById("result").textContent.includes("Press Pay again")`)
	serve(addr) // the restart: a new storefront, nothing in memory

	payUntilDone(t, e, buyer, func() { click(t, ctx, "#pay") }, func() bool {
		return eval[bool](t, ctx, `!!document.getElementById("order-link")`) ||
			eval[bool](t, ctx, `document.getElementById("result").textContent.includes("empty")`)
	}, 30*time.Second)
	orders := e.orders(t, buyer)
	require.Len(t, orders, 1, "one order")
	pis := e.intents(orders[0])
	require.Len(t, pis, 1, "one PaymentIntent")
	require.Equal(t, "succeeded", pis[0].Status, "one charge")
	require.True(t, eval[bool](t, ctx, `!!document.getElementById("order-link")`),
		"the retry got the order: %s", eval[string](t, ctx, `document.getElementById("result").textContent`))
	href := eval[string](t, ctx, `document.getElementById("order-link").getAttribute("href")`)
	require.Equal(t, "/orders/"+orders[0], href)
}

// TestChangedDetailsAfterLostAnswer: the answer to the first Pay is lost
// (the api paid the order); the form is locked from the first Pay, and
// even an email changed behind its back is not sent: every Pay sends the
// request stored at the first one, so the retry is the replay of the
// first order, not a 422 that told the shopper to start a new purchase
// while the first was being charged. One order, one charge, under the
// first email.
func TestChangedDetailsAfterLostAnswer(t *testing.T) {
	e := setup(t)
	ctx := e.tab(t, time.Minute)
	buyer, other := email("changed-first"), email("changed-other")
	e.toCheckout(t, ctx, buyer, "pm_card_visa")

	require.NoError(t, e.apiLink.DropAnswers())
	t.Cleanup(e.apiLink.Heal)
	click(t, ctx, "#pay")
	until(t, ctx, 20*time.Second, `document.getElementById("result").textContent.includes("we do not know")`)
	e.apiLink.Heal()
	require.Len(t, e.orders(t, buyer), 1, "the api executed the lost Pay")

	require.True(t, eval[bool](t, ctx, `document.getElementById("email").disabled && document.getElementById("payment-method").disabled`),
		"the form is locked while the purchase is open")
	require.True(t, eval[bool](t, ctx, `document.getElementById("new-purchase").hidden`),
		"no invitation to a second purchase while the first is open")
	do(t, ctx, chromedp.Reload())
	until(t, ctx, 10*time.Second, `document.getElementById("email") && document.getElementById("email").disabled`)
	require.Equal(t, buyer, eval[string](t, ctx, `document.getElementById("email").value`), "the reload shows the stored email")
	// The shopper changes the email anyway (the page's form is not the guard).
	do(t, ctx, chromedp.Evaluate[chromedp.Void](`(() => { const el = document.getElementById("email"); el.disabled = false; el.value = "`+other+`"; document.getElementById("payment-method").disabled = false; })()`))
	click(t, ctx, "#pay")
	until(t, ctx, 20*time.Second, `document.getElementById("order-link") || document.getElementById("result").textContent.includes("422")`)

	orders := e.orders(t, buyer)
	require.Len(t, orders, 1, "one order")
	require.Empty(t, e.orders(t, other), "the changed email was never sent")
	pis := e.intents(orders[0])
	require.Len(t, pis, 1)
	require.Equal(t, "succeeded", pis[0].Status, "one charge")
	_, rows := panel(t, ctx)
	last := rows[len(rows)-1]
	require.True(t, strings.HasPrefix(last.Answer, "201"), "%+v", rows)
	require.Equal(t, "yes", last.Replayed, "the first order, replayed")
}

// TestTabClosedDuringPay: the shopper presses Pay (Stripe slow, so the
// Pay is in flight), closes the tab, opens the shop again in another tab
// of the same browser (same cookies, a new sessionStorage) and goes to the
// checkout, pressing Pay if the page offers it: the reopened checkout is
// the same purchase, and the call the closed tab started still finishes.
// One order, one charge at the emulator, one email. With the purchase's
// key kept only in the tab, the closed tab abandoned the API call (the cart
// was never emptied) and the reopened checkout offered the same cart under
// a new key: a second paid order and a second email.
func TestTabClosedDuringPay(t *testing.T) {
	e := setup(t)
	window := e.tab(t, 2*time.Minute) // the browser: its cookies outlive its tabs
	first, closeFirst := chromedp.NewContext(window)
	t.Cleanup(closeFirst)
	require.NoError(t, chromedp.Do(first))
	buyer := email("tab-closed")
	e.toCheckout(t, first, buyer, "pm_card_visa")

	e.st.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, Before: 3 * time.Second})
	t.Cleanup(e.st.ClearFaults)
	click(t, first, "#pay")
	deadline := time.Now().Add(10 * time.Second)
	for len(e.orders(t, buyer)) == 0 {
		require.True(t, time.Now().Before(deadline), "the Pay reached the api")
		time.Sleep(50 * time.Millisecond)
	}
	closeFirst() // the tab closes while Stripe has not answered

	second, closeSecond := chromedp.NewContext(window)
	t.Cleanup(closeSecond)
	require.NoError(t, chromedp.Do(second))
	do(t, second, chromedp.Navigate(e.shopURL+"/checkout"))
	until(t, second, 10*time.Second, `document.getElementById("result")`)
	payUntilDone(t, e, buyer, func() {
		if eval[bool](t, second, `(() => { const b = document.getElementById("pay"); return !!b && b.offsetParent !== null; })()`) {
			// A form the page left open is filled in again, as the
			// shopper did in the first tab.
			if eval[bool](t, second, `!document.getElementById("email").disabled`) {
				do(t, second, chromedp.SetValue(chromedp.CSS("#email"), buyer), chromedp.SetValue(chromedp.CSS("#payment-method"), "pm_card_visa"))
			}
			click(t, second, "#pay")
		}
	}, func() bool { return eval[bool](t, second, `!!document.querySelector("#order-link, #last-order-link")`) }, 30*time.Second)

	require.NoError(t, e.st.Quiesce(30*time.Second))
	orders := e.orders(t, buyer)
	require.Len(t, orders, 1, "one order")
	pis := e.intents(orders[0])
	require.Len(t, pis, 1, "one PaymentIntent")
	require.Equal(t, "succeeded", pis[0].Status, "one charge")
	require.Equal(t, "paid", e.orderStatus(t, orders[0]))
	require.Equal(t, 1, e.st.Emails(orders[0]), "one email")
	href := eval[string](t, second, `document.querySelector("#order-link, #last-order-link").getAttribute("href")`)
	require.Equal(t, "/orders/"+orders[0], href, "the reopened checkout leads to the order")
}
