package storefront_test

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/storefront"
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
