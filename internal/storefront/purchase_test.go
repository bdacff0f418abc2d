package storefront_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
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

// TestPayOutlivesTheBrowser: the browser's Pay goes away (its request
// canceled, as when the tab closes) while the API has not answered; the
// call to the API goes on, and its answer ends the session's purchase: the
// checkout then shows the purchase done with its order, the cart is empty,
// and a Pay of the same purchase is answered from it, without a second
// call. With the call on the browser's request, it was abandoned and the
// purchase never ended.
func TestPayOutlivesTheBrowser(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{hold: make(chan struct{})}
	apiSrv := httptest.NewServer(api)
	t.Cleanup(apiSrv.Close)
	shop, err := storefront.New(storefront.Config{APIURL: apiSrv.URL, TenantKey: "sk_test_acme"})
	require.NoError(t, err)
	t.Cleanup(shop.Wait)
	srv := httptest.NewUnstartedServer(shop)
	// A connection closes once its handler has returned: the shop saw
	// the browser go away.
	closed := make(chan struct{}, 16)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			closed <- struct{}{}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	release := sync.OnceFunc(func() { close(api.hold) })
	t.Cleanup(release) // first: the API's server closes once its handlers return
	alice := browserSession(t)
	res, err := alice.PostForm(srv.URL+"/cart", url.Values{"sku": {"sku_tee"}, "quantity": {"1"}})
	require.NoError(t, err)
	res.Body.Close()
	state := purchaseState(t, alice, srv.URL)
	require.Equal(t, storefront.PurchaseOpen, state.Open.Status)
	key := state.Open.Key

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/checkout", strings.NewReader(purchaseBody(key, "a@example.com")))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	paid := make(chan error, 1)
	go func() {
		res, err := alice.Do(req)
		if err == nil {
			res.Body.Close()
		}
		paid <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for api.checkouts() == 0 {
		require.True(t, time.Now().Before(deadline), "the Pay reached the API")
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // the browser goes away
	require.Error(t, <-paid)
	<-closed  // and the shop's handler for it has returned
	release() // only then the API answers: paid

	for {
		state = purchaseState(t, alice, srv.URL)
		if state.Last != nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "the purchase ends without its browser: %+v", state.Open)
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, key, state.Last.Key)
	require.Equal(t, storefront.PurchaseDone, state.Last.Status)
	require.Equal(t, storefront.OutcomePaid, state.Last.Result.Outcome)
	require.Equal(t, "/orders/ord_1", state.Last.Result.OrderURL)
	require.NotEqual(t, key, state.Open.Key, "the next purchase has a key of its own")
	res, err = alice.Get(srv.URL + "/cart")
	require.NoError(t, err)
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Contains(t, string(page), "Your cart is empty", "bought")

	again := payAs(t, alice, srv.URL, purchaseBody(key, "a@example.com"))
	require.Equal(t, storefront.OutcomePaid, again.Outcome)
	require.Equal(t, 1, api.checkouts(), "answered from the purchase, no second call")
}

// purchaseState returns the session's purchases as the checkout page gets
// them (GET /checkout/purchase).
func purchaseState(t *testing.T, c *http.Client, shopURL string) (v struct {
	Open *storefront.Purchase `json:"open"`
	Last *storefront.Purchase `json:"last"`
}) {
	t.Helper()
	res, err := c.Get(shopURL + "/checkout/purchase")
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NoError(t, json.NewDecoder(res.Body).Decode(&v))
	return v
}

// TestSecondTabIsTheSamePurchase: a second tab's checkout shows the
// purchase of the first, under the same key; Pay in both (Stripe slow, so
// both are in flight) is one purchase: one order, one charge. With the
// key kept per tab, the second tab was a second purchase.
func TestSecondTabIsTheSamePurchase(t *testing.T) {
	e := setup(t)
	window := e.tab(t, time.Minute)
	first, closeFirst := chromedp.NewContext(window)
	t.Cleanup(closeFirst)
	require.NoError(t, chromedp.Do(first))
	buyer := email("second-tab")
	e.toCheckout(t, first, buyer, "pm_card_visa")
	second, closeSecond := chromedp.NewContext(window)
	t.Cleanup(closeSecond)
	require.NoError(t, chromedp.Do(second))
	do(t, second, chromedp.Navigate(e.shopURL+"/checkout"))
	e.fillCheckout(t, second, buyer, "pm_card_visa")
	key, _ := panel(t, first)
	again, _ := panel(t, second)
	require.Equal(t, key, again, "one purchase, one key, in both tabs")

	e.st.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, Before: 2 * time.Second})
	t.Cleanup(e.st.ClearFaults)
	click(t, first, "#pay")
	click(t, second, "#pay")
	until(t, first, 20*time.Second, `document.getElementById("order-link")`)
	payUntilDone(t, e, buyer, func() { click(t, second, "#pay") },
		func() bool { return eval[bool](t, second, `!!document.getElementById("order-link")`) }, 20*time.Second)

	orders := e.orders(t, buyer)
	require.Len(t, orders, 1, "one order")
	pis := e.intents(orders[0])
	require.Len(t, pis, 1, "one PaymentIntent")
	require.Equal(t, "succeeded", pis[0].Status, "one charge")
	for _, tab := range []context.Context{first, second} {
		require.Equal(t, "/orders/"+orders[0], eval[string](t, tab, `document.getElementById("order-link").getAttribute("href")`))
	}
}

// TestOneOpenPurchaseAtATime: while a purchase of the session is sent and
// unanswered, a Pay under another key (a page loaded before it was sent,
// or a made-up key) sends nothing: the answer names the open purchase,
// which the page then shows. Before, each tab's key was a purchase.
func TestOneOpenPurchaseAtATime(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{hold: make(chan struct{})}
	srv := shopFor(t, api, storefront.Config{TenantKey: "sk_test_acme"})
	release := sync.OnceFunc(func() { close(api.hold) })
	t.Cleanup(release) // first: the API's server closes once its handlers return
	alice := browserSession(t)
	const first, other = "0d6f1c2e-3b4a-4c5d-8e9f-a0b1c2d3e4f5", "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"
	paid := make(chan storefront.PayResult, 1)
	res, err := alice.Get(srv.URL + "/")
	require.NoError(t, err)
	res.Body.Close()
	go func() {
		res, err := alice.Post(srv.URL+"/checkout", "application/json", strings.NewReader(purchaseBody(first, "a@example.com")))
		var out storefront.PayResult
		if err == nil {
			_ = json.NewDecoder(res.Body).Decode(&out)
			res.Body.Close()
		}
		paid <- out
	}()
	deadline := time.Now().Add(10 * time.Second)
	for api.checkouts() == 0 {
		require.True(t, time.Now().Before(deadline), "the first Pay reached the API")
		time.Sleep(10 * time.Millisecond)
	}
	out := payAs(t, alice, srv.URL, purchaseBody(other, "b@example.com"))
	require.Equal(t, storefront.OutcomeUnknown, out.Outcome)
	require.False(t, out.Final)
	require.Equal(t, first, out.Key, "the answer names the open purchase")
	release()
	require.Equal(t, storefront.OutcomePaid, (<-paid).Outcome)
	require.Equal(t, 1, api.checkouts(), "nothing sent for the other key")
}
