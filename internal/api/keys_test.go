package api_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/api"
	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/refunds"
)

// TestEveryKeyedRouteHasACompleter: every route behind the idempotency
// gateway (every route that takes an Idempotency-Key, as the API registers
// them) has a resume path in api.Completer, the completer every process
// that completes keys runs (cmd/worker): a key of it whose process died is
// taken over and resumed by that route's command. A new keyed route
// without one fails here, rather than leaving its unfinished keys to a
// client's retry for ever.
func TestEveryKeyedRouteHasACompleter(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Subset(t, h.api.KeyRoutes, []string{checkout.Route, checkout.CancelRoute, refunds.Route},
		"the gateway lists the routes it guards")

	completer := api.Completer(h.db, h.api.Service, h.api.Refunds)
	for _, route := range h.api.KeyRoutes {
		require.Contains(t, completer.Commands.Routes(), route, "keyed route %q has no command to resume its keys", route)
		require.NotNil(t, completer.Commands[route](), "keyed route %q has no command to resume its keys", route)
	}
}
