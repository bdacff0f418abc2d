package ids_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/ids"
)

func TestValid(t *testing.T) {
	t.Parallel()
	require.True(t, ids.Valid("ord", ids.New("ord")))
	require.True(t, ids.Valid("rf", ids.New("rf")))
	for _, bad := range []string{
		"", "ord_", "ord", ids.New("rf"), ids.New("ord") + "0",
		"ord_0193F2A4C5D67E8F9A0B1C2D3E4F5A6B", // uppercase
		"ord-0193f2a4c5d67e8f9a0b1c2d3e4f5a6b", // separator
		"ord_0193f2a4c5d67e8f9a0b1c2d3e4f5a6g", // not hex
	} {
		require.False(t, ids.Valid("ord", bad), bad)
	}
}
