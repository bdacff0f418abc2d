package storefront_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/storefront"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// buy adds quantity of the tee to c's cart, opens the checkout's purchase
// (GET /checkout/purchase, as the page's load does) and pays it; it
// returns the purchase's key.
func buy(t *testing.T, c *http.Client, shopURL string, quantity int) string {
	t.Helper()
	key := openPurchase(t, c, shopURL, quantity)
	out := payAs(t, c, shopURL, purchaseBody(key, "a@example.com"))
	require.Equal(t, storefront.OutcomePaid, out.Outcome, out.Message)
	return key
}

// openPurchase adds quantity of the tee to c's cart and returns the key of
// the session's open purchase.
func openPurchase(t *testing.T, c *http.Client, shopURL string, quantity int) string {
	t.Helper()
	res, err := c.PostForm(shopURL+"/cart", url.Values{"sku": {"sku_tee"}, "quantity": {strconv.Itoa(quantity)}})
	require.NoError(t, err)
	res.Body.Close()
	state := purchaseState(t, c, shopURL)
	require.Equal(t, storefront.PurchaseOpen, state.Open.Status)
	return state.Open.Key
}

// cartPage returns the text of c's cart page.
func cartPage(t *testing.T, c *http.Client, shopURL string) string {
	t.Helper()
	res, err := c.Get(shopURL + "/cart")
	require.NoError(t, err)
	defer res.Body.Close()
	page, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return string(page)
}

// TestStalePaySendsNothing: purchase A paid, then purchase B paid; a Pay
// that still carries A's key (a second tab opened before A was paid, and
// left open) is no purchase of the session's any more: the storefront
// sends nothing to the API and answers with the session's current
// purchase, which the page then shows. Before, the storefront remembered
// only the last purchase (B) and sent A's key to the API again: a replay
// within the API's retention, and once the API had reaped the key
// (IDEMPOTENCY_TTL), a new order and a second charge for A.
func TestStalePaySendsNothing(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{}
	srv := shopFor(t, api, storefront.Config{TenantKey: "sk_test_acme"})
	alice := browserSession(t)
	a := buy(t, alice, srv.URL, 1)
	b := buy(t, alice, srv.URL, 1)
	require.Equal(t, 2, api.checkouts())

	out := payAs(t, alice, srv.URL, purchaseBody(a, "a@example.com"))
	require.Equal(t, storefront.OutcomeStale, out.Outcome, out.Message)
	require.False(t, out.Final)
	require.Empty(t, out.OrderID, "no order for a stale page")
	require.NotEqual(t, a, out.Key, "the answer names the current purchase")
	require.NotEqual(t, b, out.Key, "which is a new one: B is done")
	require.Contains(t, out.Message, "out of date")
	require.Equal(t, 2, api.checkouts(), "nothing sent for A's key")
	require.Equal(t, out.Key, purchaseState(t, alice, srv.URL).Open.Key, "the current purchase is the one the answer named")

	again := payAs(t, alice, srv.URL, purchaseBody(b, "a@example.com"))
	require.Equal(t, storefront.OutcomePaid, again.Outcome, "B's page gets B's answer, from the storefront")
	require.Equal(t, 2, api.checkouts(), "without a call")
}

// TestStalePayKeepsTheCart: purchase K paid, K2 paid; the shopper puts
// three tees in the cart and opens the checkout (purchase K3, open); a Pay
// with K's key sends nothing, leaves the cart and K3 as they were, and
// answers with K3. Before, K3 yielded to K: the API replayed K's order,
// the page said "Paid. Thank you!" and the cart was emptied, with the
// three tees never bought.
func TestStalePayKeepsTheCart(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{}
	srv := shopFor(t, api, storefront.Config{TenantKey: "sk_test_acme"})
	alice := browserSession(t)
	k := buy(t, alice, srv.URL, 1)
	buy(t, alice, srv.URL, 1)
	k3 := openPurchase(t, alice, srv.URL, 3)
	require.Contains(t, cartPage(t, alice, srv.URL), "<td>3</td>")

	out := payAs(t, alice, srv.URL, purchaseBody(k, "a@example.com"))
	require.Equal(t, storefront.OutcomeStale, out.Outcome, out.Message)
	require.Equal(t, k3, out.Key, "the answer names the open purchase")
	require.Equal(t, 2, api.checkouts(), "nothing sent for K's key")
	require.Contains(t, cartPage(t, alice, srv.URL), "<td>3</td>", "the cart is kept")
	state := purchaseState(t, alice, srv.URL)
	require.Equal(t, k3, state.Open.Key)
	require.Equal(t, storefront.PurchaseOpen, state.Open.Status, "K3 is still open, nothing sent under it")
	require.Zero(t, state.Open.Pays)
}

// TestStalePageSendsNothing: the same as a shopper's browser. Tab "left"
// opens the checkout (purchase A) and stays open; tab "first" pays A, and
// its answer is lost, so it keeps A's request in sessionStorage; tab
// "second" gets A's order, buys B, puts three tees in the cart and opens
// the checkout (K3). Then "first" reloads: it shows K3, not A's stored
// request (checkout.js gave a stored request back whenever the server's
// last purchase was another one); and "left" presses Pay: nothing is
// sent, the cart keeps its three tees, and the page shows K3 and says it
// was out of date (the storefront sent A's key to the API, which replayed
// A's order: "Paid", and the three tees' cart emptied). Two orders, each
// charged once.
func TestStalePageSendsNothing(t *testing.T) {
	e := setup(t)
	window := e.tab(t, 2*time.Minute) // the browser: its tabs share its cookies
	newTab := func() context.Context {
		ctx, cancel := chromedp.NewContext(window)
		t.Cleanup(cancel)
		require.NoError(t, chromedp.Do(ctx))
		return ctx
	}
	keyIs := func(key string) string {
		return `document.getElementById("browser-key") && document.getElementById("browser-key").textContent === "` + key + `"`
	}
	buyer := email("stale-page")
	first := newTab()
	e.toCheckout(t, first, buyer, "pm_card_visa")
	a, _ := panel(t, first)
	left := newTab()
	do(t, left, chromedp.Navigate(e.shopURL+"/checkout"))
	e.fillCheckout(t, left, buyer, "pm_card_visa")
	require.Equal(t, a, eval[string](t, left, `document.getElementById("browser-key").textContent`))

	require.NoError(t, e.apiLink.DropAnswers())
	t.Cleanup(e.apiLink.Heal)
	click(t, first, "#pay")
	until(t, first, 20*time.Second, `document.getElementById("result").textContent.includes("we do not know")`)
	e.apiLink.Heal()
	require.Len(t, e.orders(t, buyer), 1, "the api executed A's Pay")

	second := newTab()
	do(t, second, chromedp.Navigate(e.shopURL+"/checkout"))
	until(t, second, 10*time.Second, keyIs(a))
	click(t, second, "#pay")
	until(t, second, 20*time.Second, `document.getElementById("order-link")`)
	e.toCheckout(t, second, buyer, "pm_card_visa")
	click(t, second, "#pay")
	until(t, second, 20*time.Second, `document.getElementById("order-link")`)
	require.Len(t, e.orders(t, buyer), 2, "A and B")
	do(t, second, chromedp.Navigate(e.shopURL+"/"))
	do(t, second, chromedp.SetValue(chromedp.CSS(`#product-sku_tee input[name="quantity"]`), "3"))
	click(t, second, "#add-sku_tee")
	until(t, second, 10*time.Second, `document.getElementById("to-checkout")`)
	click(t, second, "#to-checkout")
	e.fillCheckout(t, second, buyer, "pm_card_visa")
	k3, _ := panel(t, second)
	require.NotEqual(t, a, k3)

	do(t, first, chromedp.Reload())
	until(t, first, 10*time.Second, keyIs(k3))
	require.False(t, eval[bool](t, first, `document.getElementById("email").disabled`), "K3's form is open")

	click(t, left, "#pay")
	until(t, left, 10*time.Second, keyIs(k3)+` && document.getElementById("result").textContent.includes("out of date")`)
	require.False(t, eval[bool](t, left, `!!document.getElementById("order-link")`), "no order shown for the stale page")

	orders := e.orders(t, buyer)
	require.Len(t, orders, 2, "A and B, nothing more")
	for _, o := range orders {
		pis := e.intents(o)
		require.Len(t, pis, 1, "one PaymentIntent for %s", o)
		require.Equal(t, "succeeded", pis[0].Status, "one charge for %s", o)
	}
	do(t, second, chromedp.Navigate(e.shopURL+"/cart"))
	until(t, second, 10*time.Second, `document.querySelector("main")`)
	require.Equal(t, "3", eval[string](t, second, `(() => { const c = document.querySelector(".lines tr:nth-child(2) td:nth-child(2)"); return c ? c.textContent : ""; })()`),
		"the three tees are still in the cart: %s", eval[string](t, second, `document.querySelector("main").innerText`))
	do(t, second, chromedp.Navigate(e.shopURL+"/checkout"))
	until(t, second, 10*time.Second, keyIs(k3))
	key, rows := panel(t, second)
	require.Equal(t, k3, key)
	require.Empty(t, rows, "nothing sent under K3")
	require.False(t, eval[bool](t, second, `document.getElementById("email").disabled`), "K3 is open")
}

// TestStalePayAfterTheKeyIsReaped: finding (a) against the real API, on a
// stack of the test's own whose IDEMPOTENCY_TTL is 2s and whose reaper
// runs every 200ms. Purchase A paid, purchase B paid; once the API has
// reaped A's key, a Pay with A's key and body (a tab left open since A)
// sends nothing and is answered with the current purchase: still two
// orders, two charges. Before, the storefront sent A's key again, the API
// no longer knew it, and made a third order and charged it: A bought
// twice.
func TestStalePayAfterTheKeyIsReaped(t *testing.T) {
	e := setup(t)
	st := stack.Start(t, stack.Options{BinDir: e.bin, TTL: 2 * time.Second, Lease: 500 * time.Millisecond,
		Env: map[string]map[string]string{"worker": {"REAPER_INTERVAL": "200ms"}}})
	shop, err := storefront.New(storefront.Config{APIURL: st.APIURL, TenantKey: "sk_test_acme", Retry: testRetry})
	require.NoError(t, err)
	t.Cleanup(shop.Wait)
	srv := httptest.NewServer(shop)
	t.Cleanup(srv.Close)
	alice := browserSession(t)

	a := openPurchase(t, alice, srv.URL, 1)
	bodyA := purchaseBody(a, "reaped@example.com")
	paidA := payAs(t, alice, srv.URL, bodyA)
	require.Equal(t, storefront.OutcomePaid, paidA.Outcome, paidA.Message)
	b := openPurchase(t, alice, srv.URL, 1)
	paidB := payAs(t, alice, srv.URL, purchaseBody(b, "reaped@example.com"))
	require.Equal(t, storefront.OutcomePaid, paidB.Outcome, paidB.Message)
	require.NotEqual(t, paidA.OrderID, paidB.OrderID)

	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := st.Key(paidA.APIKey); !ok {
			break
		}
		require.True(t, time.Now().Before(deadline), "the API reaps A's key after its TTL")
		time.Sleep(100 * time.Millisecond)
	}

	out := payAs(t, alice, srv.URL, bodyA)
	require.Equal(t, storefront.OutcomeStale, out.Outcome, "%s (order %s; A's was %s; %d orders, %d charges)",
		out.Message, out.OrderID, paidA.OrderID, st.Orders(), stack.MoneyMoving(st.PaymentIntents()))
	require.Empty(t, out.OrderID)
	require.Equal(t, purchaseState(t, alice, srv.URL).Open.Key, out.Key, "the answer names the current purchase")
	_, sent := st.Key(paidA.APIKey)
	require.False(t, sent, "A's key was not sent again")
	require.Equal(t, 2, st.Orders(), "A and B, nothing more")
	require.Equal(t, 2, stack.MoneyMoving(st.PaymentIntents()), "two charges")
}
