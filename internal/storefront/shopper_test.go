package storefront_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// The storefront as a shopper sees it (issue 36, item 7): each test is one
// of the shopper's findings, in headless Chromium against the whole stack.

// TestDeclineOpensANewPurchase: after a declined card the page says why
// and that nothing was charged, and opens the form again under a new key
// for another card (it used to stay locked, and Pay repeated the decline
// until a reload the page never suggested); the next card pays. Two
// orders: the declined one, failed, and the paid one, charged once.
func TestDeclineOpensANewPurchase(t *testing.T) {
	e := setup(t)
	ctx := e.tab(t, time.Minute)
	buyer := email("decline")
	e.toCheckout(t, ctx, buyer, "pm_card_chargeDeclined")
	firstKey := eval[string](t, ctx, `document.getElementById("browser-key").textContent`)
	click(t, ctx, "#pay")
	until(t, ctx, 20*time.Second, `document.getElementById("result").textContent.includes("declined")`)
	require.Contains(t, eval[string](t, ctx, `document.getElementById("result").textContent`), "Nothing was charged")
	until(t, ctx, 10*time.Second, `!document.getElementById("payment-method").disabled && document.getElementById("browser-key").textContent !== "`+firstKey+`"`)
	require.False(t, eval[bool](t, ctx, `document.getElementById("email").disabled`), "the form is open again")
	require.Equal(t, buyer, eval[string](t, ctx, `document.getElementById("email").value`), "with the email kept")

	do(t, ctx, chromedp.SetValue(chromedp.CSS("#payment-method"), "pm_card_visa"))
	click(t, ctx, "#pay")
	until(t, ctx, 20*time.Second, `document.getElementById("order-link")`)

	orders := e.orders(t, buyer)
	require.Len(t, orders, 2, "the declined order and the paid one")
	require.Equal(t, "payment_failed", e.orderStatus(t, orders[0]))
	require.Equal(t, "paid", e.orderStatus(t, orders[1]))
	pis := e.intents(orders[1])
	require.Len(t, pis, 1)
	require.Equal(t, "succeeded", pis[0].Status, "one charge")
	for _, pi := range e.intents(orders[0]) {
		require.NotEqual(t, "succeeded", pi.Status, "nothing charged for the declined order")
	}

	// The declined order's page says why, in words.
	do(t, ctx, chromedp.Navigate(e.shopURL+"/orders/"+orders[0]))
	until(t, ctx, 10*time.Second, `document.getElementById("order-status")`)
	require.Equal(t, "Payment failed", eval[string](t, ctx, `document.getElementById("order-status").textContent`))
	require.Contains(t, eval[string](t, ctx, `document.getElementById("reason").textContent`), "Your card was declined")
}

// TestPanelExplainsTheAnswers: the checkout's panel says what a 409
// idempotency_key_in_use and "Replayed" mean, beside the attempts that
// show them.
func TestPanelExplainsTheAnswers(t *testing.T) {
	e := setup(t)
	ctx := e.tab(t, time.Minute)
	e.toCheckout(t, ctx, email("panel"), "pm_card_visa")
	help := eval[string](t, ctx, `document.getElementById("panel-help").innerText`)
	require.Contains(t, help, "409 idempotency_key_in_use")
	require.Contains(t, help, "still running")
	require.Contains(t, help, "Replayed: yes")
	require.Contains(t, help, "no new charge")
}

// TestBackAfterBuying: after a purchase, the Back button to the checkout
// and then to the cart shows no bought item: the pages a browser restores
// from its back/forward cache load again from the shop.
func TestBackAfterBuying(t *testing.T) {
	e := setup(t)
	ctx := e.tab(t, time.Minute)
	buyer := email("back")
	e.toCheckout(t, ctx, buyer, "pm_card_visa")
	click(t, ctx, "#pay")
	until(t, ctx, 20*time.Second, `document.getElementById("order-link")`)
	click(t, ctx, "#order-link")
	until(t, ctx, 10*time.Second, `document.getElementById("order-status")`)

	do(t, ctx, chromedp.Evaluate[chromedp.Void](`history.back()`)) // the Back button, to the checkout
	until(t, ctx, 10*time.Second, `location.pathname === "/checkout" && document.readyState === "complete" && !document.querySelector(".lines")`)
	require.Contains(t, eval[string](t, ctx, `document.querySelector("main").innerText`), "Your cart is empty")
	require.Equal(t, "/orders/"+e.orders(t, buyer)[0],
		eval[string](t, ctx, `document.getElementById("last-order-link").getAttribute("href")`), "the purchase's order, done")

	do(t, ctx, chromedp.Evaluate[chromedp.Void](`history.back()`)) // and to the cart
	until(t, ctx, 10*time.Second, `location.pathname === "/cart" && document.readyState === "complete" && !document.querySelector(".lines")`)
	require.Contains(t, eval[string](t, ctx, `document.querySelector("main").innerText`), "Your cart is empty")
	require.Len(t, e.orders(t, buyer), 1)
}

// TestWithoutJavaScript: with scripts off, the checkout says that it needs
// them (<noscript>), and Pay posts the form, which the shop refuses with
// nothing charged: the email never goes into a URL (a GET form put it
// there, and the page silently reloaded).
func TestWithoutJavaScript(t *testing.T) {
	e := setup(t)
	chromium, err := chromiumPath()
	require.NoError(t, err)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.Flag("blink-settings", "scriptEnabled=false"))
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	ctx, cancel := context.WithTimeout(browser, time.Minute)
	t.Cleanup(cancel)
	before := e.st.Orders()

	do(t, ctx, chromedp.Navigate(e.shopURL+"/"))
	click(t, ctx, "#add-sku_tee")
	click(t, ctx, "#to-checkout")
	page, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Contains(t, page, "This checkout needs JavaScript", "the <noscript> message shows")
	click(t, ctx, "#pay")
	deadline := time.Now().Add(10 * time.Second)
	for {
		title, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("h1")))
		if err == nil && strings.Contains(title, "needs JavaScript") {
			break
		}
		require.True(t, time.Now().Before(deadline), "the refusal page: %v %q", err, title)
		time.Sleep(100 * time.Millisecond)
	}
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, e.shopURL+"/checkout", loc, "posted: no email in the URL")
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
	require.NoError(t, err)
	require.Contains(t, text, "Nothing was charged")
	require.Equal(t, before, e.st.Orders(), "no order")
}
