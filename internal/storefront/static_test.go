package storefront_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/storefront"
)

// TestStaticHasNoListing: /static/ serves the page's scripts and
// stylesheet by name, and neither lists its directory nor serves the
// templates that share it.
func TestStaticHasNoListing(t *testing.T) {
	t.Parallel()
	shop, err := storefront.New(storefront.Config{APIURL: "http://127.0.0.1:1", TenantKey: "sk_test_acme"})
	require.NoError(t, err)
	srv := httptest.NewServer(shop)
	t.Cleanup(srv.Close)
	get := func(p string) (int, string) {
		res, err := http.Get(srv.URL + p)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, p := range []string{"/static/", "/static/checkout.html", "/static/layout.html", "/static/index.html", "/static/web/"} {
		code, body := get(p)
		require.Equal(t, http.StatusNotFound, code, p)
		require.NotContains(t, body, ".html", p)
	}
	for _, p := range []string{"/static/checkout.js", "/static/order.js", "/static/shop.css"} {
		code, _ := get(p)
		require.Equal(t, http.StatusOK, code, p)
	}
}
