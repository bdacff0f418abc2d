package storefront_test

import (
	"encoding/json"
	"io"
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
	mu    sync.Mutex
	keys  []string
	auths []string
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
		f.mu.Unlock()
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
	srv := httptest.NewServer(shop)
	t.Cleanup(srv.Close)

	pay := func(c *http.Client, key string) storefront.PayResult {
		t.Helper()
		res, err := c.PostForm(srv.URL+"/cart", url.Values{"sku": {"sku_tee"}, "quantity": {"1"}})
		require.NoError(t, err)
		page, _ := io.ReadAll(res.Body)
		res.Body.Close()
		require.NotContains(t, string(page), "sk_test_secret_of_acme")
		res, err = c.Post(srv.URL+"/checkout", "application/json",
			strings.NewReader(`{"key":"`+key+`","email":"a@example.com","payment_method":"pm_card_visa"}`))
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

	require.Equal(t, "paid", first.Outcome)
	require.Equal(t, first.APIKey, again.APIKey, "one browser, one purchase: one key at the API")
	require.NotEqual(t, first.APIKey, copied.APIKey, "another session's copy of the key is another purchase")
	require.NotContains(t, first.APIKey, key, "the API sees no browser key")
	require.Equal(t, []string{first.APIKey, first.APIKey, copied.APIKey}, api.keys)
	for _, a := range api.auths {
		require.Equal(t, "Bearer sk_test_secret_of_acme", a)
	}

	res, err := alice.Post(srv.URL+"/checkout", "application/json", strings.NewReader(`{"key":"x","email":"a@example.com"}`))
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "a key the page cannot have made")
}
