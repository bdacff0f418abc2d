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
// handed to a service that says it resumes that route. A new keyed route
// without one fails here, rather than leaving its unfinished keys to a
// client's retry for ever.
func TestEveryKeyedRouteHasACompleter(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Subset(t, h.api.KeyRoutes, []string{checkout.Route, checkout.CancelRoute, refunds.Route},
		"the gateway lists the routes it guards")

	completer := api.Completer(h.db, h.api.Service, h.api.Refunds)
	for _, route := range h.api.KeyRoutes {
		c, ok := completer.Routes[route]
		require.True(t, ok, "keyed route %q has no completer", route)
		rc, ok := c.(interface{ KeyRoutes() []string })
		require.True(t, ok, "the completer of %q does not name the routes it takes over", route)
		require.Contains(t, rc.KeyRoutes(), route, "the completer of %q does not take its keys over", route)
	}
}
