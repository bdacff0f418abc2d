package auth_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/auth"
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, wantErr string
	}{
		{"the development default", auth.DefaultKeys, ""},
		{"spaces and an empty entry are fine", " acme:k1 , ,globex:k2 ", ""},
		{"no colon", "acme", "entry 1"},
		{"empty key", "acme:", "entry 1"},
		{"empty tenant", ":k", "entry 1"},
		{"a key used twice", "acme:k,globex:k", "used twice"},
		{"nothing", " , ", "no keys"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := auth.ParseKeys(tc.in)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestTenantAndDevelopmentKeys(t *testing.T) {
	t.Parallel()
	keys, err := auth.ParseKeys("acme:sk_live_a,globex:sk_live_b")
	require.NoError(t, err)
	tenant, ok := keys.Tenant("sk_live_b")
	require.True(t, ok)
	require.Equal(t, "globex", tenant)
	_, ok = keys.Tenant("sk_live_c")
	require.False(t, ok)
	require.False(t, keys.UsesDevelopmentKey())

	for _, dev := range []string{auth.DefaultKeys, "x:sk_live_a,y:sk_test_globex", "other:sk_test_acme"} {
		k, err := auth.ParseKeys(dev)
		require.NoError(t, err)
		require.True(t, k.UsesDevelopmentKey(), dev)
	}
	for _, fp := range keys.Fingerprints() {
		require.NotContains(t, fp, "sk_live", "fingerprints never show a key")
	}
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	keys, err := auth.ParseKeys(auth.DefaultKeys)
	require.NoError(t, err)
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.GET("/", auth.Middleware(keys), func(c *gin.Context) { c.String(200, auth.TenantOf(c)) })
	tests := []struct {
		name   string
		header []string
		status int
		body   string
	}{
		{"a valid key", []string{"Bearer sk_test_globex"}, 200, "globex"},
		{"the scheme is case-insensitive", []string{"bearer sk_test_acme"}, 200, "acme"},
		{"no header", nil, 401, ""},
		{"an unknown key", []string{"Bearer sk_test_nope"}, 401, ""},
		{"basic auth", []string{"Basic c2tfdGVzdF9hY21lOg=="}, 401, ""},
		{"two headers are ambiguous", []string{"Bearer sk_test_acme", "Bearer sk_test_globex"}, 401, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, h := range tc.header {
				req.Header.Add("Authorization", h)
			}
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			require.Equal(t, tc.status, w.Code)
			if tc.status == 200 {
				require.Equal(t, tc.body, w.Body.String())
			} else {
				require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
				require.True(t, strings.Contains(w.Body.String(), `"code":"unauthorized"`))
				require.NotEmpty(t, w.Header().Get("WWW-Authenticate"))
			}
		})
	}
}
