package storefront_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/storefront"
)

// lockedBuffer is a bytes.Buffer the server's goroutines may write to while
// the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRequestsAreLogged: each request is one "http request" line with its
// method, path, route and status, and never the query, where a return from
// 3D Secure carries the PaymentIntent's client secret.
func TestRequestsAreLogged(t *testing.T) {
	t.Parallel()
	var out lockedBuffer
	shop, err := storefront.New(storefront.Config{APIURL: "http://127.0.0.1:1", TenantKey: "sk_test_acme",
		Logger: slog.New(slog.NewJSONHandler(&out, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(shop)
	t.Cleanup(srv.Close)
	for _, p := range []string{"/static/shop.css", "/static/nothing.js?payment_intent_client_secret=pi_x_secret_y"} {
		res, err := http.Get(srv.URL + p)
		require.NoError(t, err)
		res.Body.Close()
	}
	require.NotContains(t, out.String(), "secret_y")
	type line struct {
		Msg, Method, Path, Route string
		Status                   int
	}
	var got []line
	dec := json.NewDecoder(bytes.NewReader([]byte(out.String())))
	for dec.More() {
		var l line
		require.NoError(t, dec.Decode(&l))
		if l.Msg == "http request" {
			got = append(got, l)
		}
	}
	require.Equal(t, []line{
		{Msg: "http request", Method: "GET", Path: "/static/shop.css", Route: "GET /static/{file}", Status: 200},
		{Msg: "http request", Method: "GET", Path: "/static/nothing.js", Route: "GET /static/{file}", Status: 404},
	}, got)
}
