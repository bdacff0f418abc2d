package storefront_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/storefront"
)

// fakeAPI answers the storefront's calls like the checkout API would for a
// paid order, and records the keys and credentials each checkout carried.
type fakeAPI struct {
	mu     sync.Mutex
	keys   []string
	auths  []string
	bodies []string
	// reused makes every checkout answer 422 idempotency_key_reused.
	reused bool
	// internal makes every checkout answer 500 internal, which the API
	// does not store under the key.
	internal bool
	// hold, when set, holds every checkout's answer until it is closed.
	hold chan struct{}
}

// checkouts returns how many checkouts the API got.
func (f *fakeAPI) checkouts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keys)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/products":
		_, _ = io.WriteString(w, `{"data":[{"sku":"sku_tee","name":"T-shirt","unit_amount":2500,"currency":"usd","stock":10}]}`)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/checkouts":
		f.mu.Lock()
		f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
		f.auths = append(f.auths, r.Header.Get("Authorization"))
		body, _ := io.ReadAll(r.Body)
		f.bodies = append(f.bodies, string(body))
		reused, internal, hold := f.reused, f.internal, f.hold
		f.mu.Unlock()
		if hold != nil {
			<-hold
		}
		if internal {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"Internal error","status":500,"code":"internal"}`)
			return
		}
		if reused {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"type":"about:blank","title":"Idempotency-Key reused","status":422,"code":"idempotency_key_reused"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ord_1","status":"paid","email":"a@example.com","currency":"usd","amount_total":2500,
			"items":[{"sku":"sku_tee","quantity":1,"unit_amount":2500,"amount":2500}],"payment":{"provider":"stripe"},"created_at":"2026-01-01T00:00:00Z"}`)
	default:
		http.NotFound(w, r)
	}
}

// browserSession is a cookie jar, as one browser.
func browserSession(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar}
}

// purchaseBody is a Pay's body, as the page stores it at the first Pay.
func purchaseBody(key, email string) string {
	return `{"key":"` + key + `","items":[{"sku":"sku_tee","quantity":1}],"email":"` + email + `","payment_method":"pm_card_visa"}`
}

// payAs posts body to the shop's /checkout as browser c, after opening the
// shop's page first, as a browser does, when c has no cookie for it yet.
func payAs(t *testing.T, c *http.Client, shopURL, body string) storefront.PayResult {
	t.Helper()
	if u, _ := url.Parse(shopURL); len(c.Jar.Cookies(u)) == 0 {
		res, err := c.Get(shopURL + "/")
		require.NoError(t, err)
		res.Body.Close()
	}
	res, err := c.Post(shopURL+"/checkout", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer res.Body.Close()
	var out storefront.PayResult
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	return out
}

// shopFor starts a storefront for api with cfg, at addr if given.
func shopFor(t *testing.T, api http.Handler, cfg storefront.Config, addr ...string) *httptest.Server {
	t.Helper()
	apiSrv := httptest.NewServer(api)
	t.Cleanup(apiSrv.Close)
	cfg.APIURL = apiSrv.URL
	shop, err := storefront.New(cfg)
	require.NoError(t, err)
	t.Cleanup(shop.Wait)
	srv := httptest.NewUnstartedServer(shop)
	if len(addr) > 0 {
		ln, err := net.Listen("tcp", addr[0])
		require.NoError(t, err)
		srv.Listener.Close()
		srv.Listener = ln
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// TestRestartKeepsThePurchase: a browser's Pay retried after a restart of
// the storefront (a new Server, nothing in memory) reaches the API under
// the same key with the same body, though the new server has no cart: the
// session is the signed cookie's and the body is the browser's stored
// request. A cookie whose signature is not the storefront's is a new
// session. With sessions in memory, the retry was "Your cart is empty"
// (final) and the next Pay a second order under another key.
func TestRestartKeepsThePurchase(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{}
	cfg := storefront.Config{TenantKey: "sk_test_acme"}
	before := shopFor(t, api, cfg)
	alice := browserSession(t)
	const key = "5f0c3b2a-9d1e-4c7b-8a6f-2e3d4c5b6a70"
	first := payAs(t, alice, before.URL, purchaseBody(key, "a@example.com"))
	before.Close()

	after := shopFor(t, api, cfg, before.Listener.Addr().String()) // the restarted storefront
	v, _ := url.Parse(after.URL)
	again := payAs(t, alice, after.URL, purchaseBody(key, "a@example.com"))
	require.Equal(t, storefront.OutcomePaid, again.Outcome, again.Message)
	require.Equal(t, first.APIKey, again.APIKey, "the same purchase at the API after the restart")
	require.Equal(t, api.bodies[0], api.bodies[1], "the same body")

	forged := browserSession(t)
	forged.Jar.SetCookies(v, []*http.Cookie{{Name: "storefront_session", Value: "0123456789abcdef0123456789abcdef.00"}})
	other := payAs(t, forged, after.URL, purchaseBody(key, "a@example.com"))
	require.Equal(t, storefront.OutcomeInvalid, other.Outcome, "an unsigned session id is not a session")
	require.Len(t, api.keys, 2, "nothing sent for it")
}

// TestKeyReusedKeepsThePurchase: a 422 idempotency_key_reused is no
// outcome of the purchase (its first request may still be charged): the
// page keeps the key and is never told to start a new purchase.
func TestKeyReusedKeepsThePurchase(t *testing.T) {
	t.Parallel()
	srv := shopFor(t, &fakeAPI{reused: true}, storefront.Config{TenantKey: "sk_test_acme"})
	out := payAs(t, browserSession(t), srv.URL, purchaseBody("7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "a@example.com"))
	require.Equal(t, storefront.OutcomeUnknown, out.Outcome)
	require.False(t, out.Final, "the key is kept")
	require.Contains(t, out.Message, "still being processed with its original details")
	require.NotContains(t, out.Message, "Start a new one")
}

// TestInternalErrorKeepsThePurchase: a 500 internal is stored under no key,
// and the work it interrupted may still be finished (the completer) and
// charge: the purchase stays open under its key, and the next Pay sends
// that key again, never a new purchase that could charge a second time.
func TestInternalErrorKeepsThePurchase(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{internal: true}
	srv := shopFor(t, api, storefront.Config{TenantKey: "sk_test_acme"})
	c := browserSession(t)
	body := purchaseBody("8b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e", "a@example.com")
	out := payAs(t, c, srv.URL, body)
	require.Equal(t, storefront.OutcomeUnknown, out.Outcome)
	require.False(t, out.Final, "the key is kept")
	out = payAs(t, c, srv.URL, body)
	require.False(t, out.Final)
	require.Equal(t, 2, api.checkouts())
	api.mu.Lock()
	defer api.mu.Unlock()
	require.Equal(t, api.keys[0], api.keys[1], "the same purchase, under the same key")
}

// TestPayChecksItems: the body the storefront sends the API is built from
// the browser's request, so it checks the items: catalog SKUs, each once,
// quantities 1..100, at least one line.
func TestPayChecksItems(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{}
	srv := shopFor(t, api, storefront.Config{TenantKey: "sk_test_acme"})
	for _, items := range []string{`[]`, `[{"sku":"sku_nope","quantity":1}]`, `[{"sku":"sku_tee","quantity":0}]`,
		`[{"sku":"sku_tee","quantity":101}]`, `[{"sku":"sku_tee","quantity":1},{"sku":"sku_tee","quantity":1}]`} {
		res, err := http.Post(srv.URL+"/checkout", "application/json",
			strings.NewReader(`{"key":"7a1b2c3d-4e5f","items":`+items+`,"email":"a@example.com","payment_method":"pm_card_visa"}`))
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusBadRequest, res.StatusCode, items)
	}
	require.Empty(t, api.keys, "nothing sent to the API")
}

// TestKeysAreScopedToTheSession: two browsers that send the same key (one
// copied it from the other's panel) are two purchases at the API, while one
// browser's Pays under its key are one; the tenant's secret goes to the API
// only, and no answer to the browser carries it.
func TestKeysAreScopedToTheSession(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{}
	apiSrv := httptest.NewServer(api)
	t.Cleanup(apiSrv.Close)
	shop, err := storefront.New(storefront.Config{APIURL: apiSrv.URL, TenantKey: "sk_test_secret_of_acme"})
	require.NoError(t, err)
	t.Cleanup(shop.Wait)
	srv := httptest.NewServer(shop)
	t.Cleanup(srv.Close)

	pay := func(c *http.Client, key string) storefront.PayResult {
		t.Helper()
		res, err := c.PostForm(srv.URL+"/cart", url.Values{"sku": {"sku_tee"}, "quantity": {"1"}})
		require.NoError(t, err)
		page, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.NotContains(t, string(page), "sk_test_secret_of_acme")
		res, err = c.Post(srv.URL+"/checkout", "application/json", strings.NewReader(purchaseBody(key, "a@example.com")))
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.NotContains(t, string(body), "sk_test_secret_of_acme")
		var out storefront.PayResult
		require.NoError(t, json.Unmarshal(body, &out))
		return out
	}
	alice, mallory := browserSession(t), browserSession(t)
	const key = "0b7c5f3e-5d0e-4d7a-9a57-3f1c2e8d9a10"
	first := pay(alice, key)
	again := pay(alice, key)
	copied := pay(mallory, key)

	require.Equal(t, storefront.OutcomePaid, first.Outcome)
	require.Equal(t, first.APIKey, again.APIKey, "one browser, one purchase: one key at the API")
	require.NotEqual(t, first.APIKey, copied.APIKey, "another session's copy of the key is another purchase")
	require.NotContains(t, first.APIKey, key, "the API sees no browser key")
	require.Equal(t, storefront.OutcomePaid, again.Outcome, "the done purchase's answer again")
	// Alice's second Pay is of a purchase already done: the storefront
	// answers it from the purchase it keeps, without the API.
	require.Equal(t, []string{first.APIKey, copied.APIKey}, api.keys)
	for _, a := range api.auths {
		require.Equal(t, "Bearer sk_test_secret_of_acme", a)
	}

	res, err := alice.Post(srv.URL+"/checkout", "application/json", strings.NewReader(`{"key":"x","email":"a@example.com"}`))
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "a key the page cannot have made")
}

// TestPayWithoutTheCookieIsRefused: a Pay with no session cookie (cookies
// blocked, or cleared) is refused and sends nothing to the API. Before, it
// made a new session each time, so the same browser key went to the API
// under a new Idempotency-Key at every click: two Pays, two orders.
func TestPayWithoutTheCookieIsRefused(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{}
	srv := shopFor(t, api, storefront.Config{TenantKey: "sk_test_acme"})
	const key = "3f9d2a61-8c4b-4e0f-b1a7-5d6e7f801234"
	for range 2 {
		res, err := http.Post(srv.URL+"/checkout", "application/json", strings.NewReader(purchaseBody(key, "a@example.com")))
		require.NoError(t, err)
		var out storefront.PayResult
		require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
		res.Body.Close()
		require.Equal(t, http.StatusBadRequest, res.StatusCode)
		require.Equal(t, storefront.OutcomeInvalid, out.Outcome)
		require.Contains(t, out.Message, "cookie")
	}
	require.Empty(t, api.keys, "nothing sent to the API")
}
