package idempotency

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCachedResponseRoundTrip: the replay cache's encoding gives back the
// response byte for byte, and entries written as JSON by earlier versions
// still decode.
func TestCachedResponseRoundTrip(t *testing.T) {
	t.Parallel()
	exp := time.Date(2026, 12, 2, 8, 0, 0, 123456789, time.UTC)
	r := &Response{Status: 201, Header: map[string]string{"Content-Type": "application/json", "Location": "/v1/orders/ord_1"},
		Body: []byte("{\"id\":\"ord_1\"}\n\x00\xff binary\nand lines"), ExpiresAt: exp}
	c, err := decodeCached(string(encodeCached("fp123", r)))
	require.NoError(t, err)
	require.Equal(t, "fp123", c.Fingerprint)
	require.Equal(t, r.Status, c.Response.Status)
	require.Equal(t, r.Header, c.Response.Header)
	require.Equal(t, r.Body, c.Response.Body)
	require.True(t, exp.Equal(c.Response.ExpiresAt))

	empty := &Response{Status: 409, ExpiresAt: exp}
	c, err = decodeCached(string(encodeCached("fp", empty)))
	require.NoError(t, err)
	require.Empty(t, c.Response.Body)
	require.Empty(t, c.Response.Header)

	legacy, err := json.Marshal(cachedResponse{Fingerprint: "fp0", Response: r})
	require.NoError(t, err)
	c, err = decodeCached(string(legacy))
	require.NoError(t, err)
	require.Equal(t, "fp0", c.Fingerprint)
	require.Equal(t, r.Body, c.Response.Body)

	for _, bad := range []string{"", "garbage", cachedMagic, cachedMagic + "fp\n201\n", cachedMagic + "fp\n201\n1\n2\nA\n"} {
		_, err := decodeCached(bad)
		require.Error(t, err, "%q", bad)
	}
}
