package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/postgres/pgbenchsql"
)

// TestPgbenchCheckoutScriptMirrorsTheCode keeps
// internal/checkout/pgbench_checkout.sql, which `make bench` runs with pgbench
// as the database's limit for the checkout's own SQL, in step with the
// statements a paid checkout really sends: when the code's SQL changes, this
// fails until the script is changed the same way.
func TestPgbenchCheckoutScriptMirrorsTheCode(t *testing.T) {
	t.Parallel()
	h := setup(t)
	rec, err := pgbenchsql.Record(h.db)
	require.NoError(t, err)
	// One checkout first, so that nothing a first request does once (e.g.
	// loading a type) is recorded.
	require.Equal(t, http.StatusCreated, h.checkout("pgbench-warm", teeBody).status)

	rec.Start()
	r := h.checkout("pgbench-1", `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":1}],"payment_method":"pm_card_visa"}`)
	got := rec.Stop()
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)

	want, err := pgbenchsql.Script("../checkout/pgbench_checkout.sql")
	require.NoError(t, err)
	require.Equal(t, strings.Join(want, "\n"), strings.Join(got, "\n"),
		"internal/checkout/pgbench_checkout.sql no longer sends what a checkout sends: update the script (want is the script, actual the code)")
}
