package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/testenv"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// TestEndToEndLogsHoldNoSecrets runs a stack at LOG_LEVEL=debug with API keys, a
// Stripe secret and a webhook secret of its own, sends checkouts that go
// every way (paid, replayed, reused with another body, declined, invalid,
// Stripe failing once, an unknown API key, a quoted key),
// waits until the emails are out, and then scans the logs of the api, the
// dispatcher and the worker: none holds any API key, raw Idempotency-Key,
// the Stripe secret or the webhook secret used in the run.
func TestEndToEndLogsHoldNoSecrets(t *testing.T) {
	t.Parallel()
	id := testenv.Random(6)
	var (
		acmeKey       = "sk_live_acme_" + id
		globexKey     = "sk_live_globex_" + id
		wrongKey      = "sk_live_wrong_" + id
		stripeSecret  = "sk_test_stripe_" + id
		webhookSecret = "whsec_" + id
	)
	secretEnv := map[string]string{
		"LOG_LEVEL":             "debug",
		"CHECKOUT_API_KEYS":     "acme:" + acmeKey + ",globex:" + globexKey,
		"STRIPE_SECRET_KEY":     stripeSecret,
		"STRIPE_WEBHOOK_SECRET": webhookSecret,
	}
	s := setup(t, stack.Options{Env: map[string]map[string]string{
		"api": secretEnv, "dispatcher": secretEnv, "worker": secretEnv,
		"stripe-emulator": {"STRIPE_WEBHOOK_SECRET": webhookSecret},
	}})
	ctx := testCtx(t, 90*time.Second)
	acme := &stack.Client{BaseURL: s.APIURL, APIKey: acmeKey, HTTP: http.DefaultClient}
	globex := &stack.Client{BaseURL: s.APIURL, APIKey: globexKey, HTTP: http.DefaultClient}
	wrong := &stack.Client{BaseURL: s.APIURL, APIKey: wrongKey, HTTP: http.DefaultClient}
	key := func(name string) string { return "idem-" + name + "-" + id }

	paid := acme.Checkout(ctx, key("paid"), stack.TeeBody("paid@example.com", 1))
	require.Equal(t, 201, paid.Status, "%s", paid.Body)
	require.True(t, acme.Checkout(ctx, key("paid"), stack.TeeBody("paid@example.com", 1)).Replayed)
	require.Equal(t, 422, acme.Checkout(ctx, key("paid"), stack.TeeBody("other@example.com", 1)).Status)
	require.Equal(t, 201, globex.Checkout(ctx, key("paid"), stack.TeeBody("paid@example.com", 1)).Status, "another tenant, the same key")

	declined := stack.TeeBody("declined@example.com", 1)
	declined.PaymentMethod = "pm_card_chargeDeclined"
	require.Equal(t, 402, acme.Checkout(ctx, key("declined"), declined).Status)

	invalid := stack.Body{Email: "nope", Items: []stack.Item{{SKU: "sku_nope", Quantity: 0}}}
	require.Equal(t, 400, acme.Checkout(ctx, key("invalid"), invalid).Status)

	// A 503 is not stored by Stripe: the client retries it with the same key
	// (and logs the failure, which the scan below covers).
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultFail, Count: 1, Status: 503})
	require.Equal(t, 201, acme.Checkout(ctx, key("stripe-503"), stack.TeeBody("retry@example.com", 1)).Status)

	require.Equal(t, 401, wrong.Checkout(ctx, key("wrong-api-key"), stack.TeeBody("x@example.com", 1)).Status)

	quoted := &stack.Client{BaseURL: s.APIURL, APIKey: acmeKey, HTTP: http.DefaultClient}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, quoted.BaseURL+"/v1/checkouts",
		strings.NewReader(`{"email":"q@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_visa"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+acmeKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key("quoted")+`"`)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 201, resp.StatusCode)

	// The emails of the three paid orders are out: the worker and the
	// dispatcher have done their part of the run.
	require.NoError(t, s.Quiesce(30*time.Second))
	eventually(t, 20*time.Second, func() bool { return len(s.Messages()) >= 4 }, "four emails sent")

	secrets := map[string]string{
		"acme API key": acmeKey, "globex API key": globexKey, "unknown API key": wrongKey,
		"Stripe secret": stripeSecret, "webhook secret": webhookSecret,
	}
	for _, name := range []string{"paid", "declined", "invalid", "stripe-503", "wrong-api-key", "quoted"} {
		secrets["Idempotency-Key "+name] = key(name)
	}
	for _, p := range []*stack.Process{s.API, s.Dispatcher, s.Worker} {
		require.True(t, p.LogContains(`"LOG_LEVEL":"DEBUG"`), "%s ran at debug level", p.Name)
		for what, secret := range secrets {
			require.False(t, p.LogContains(secret), "the %s log holds the %s", p.Name, what)
		}
	}
	// The scan covers the paths most likely to leak: the api logged the
	// refused API key's request and the failed Stripe call, at debug level
	// (stripe-go's own request logs included).
	require.True(t, s.API.LogContains(`"status":401`), "the 401 was logged")
	require.True(t, s.API.LogContains(`"msg":"stripe call failed, retrying with the same key"`), "the Stripe failure was logged")
	require.True(t, s.API.LogContains(`"source":"stripe-go"`), "stripe-go's debug logs are in the scan")
}
