package stripeemu_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/onceonly/checkout/internal/stripeemu"
)

// stripeClient is a stripe-go v76 client of the emulator, without retries.
func stripeClient(t testing.TB, b bundle, key string) *client.API {
	t.Helper()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(b.url),
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	api := &client.API{}
	api.Init(key, &stripe.Backends{API: backend, Connect: backend, Uploads: backend})
	return api
}

// stripeErr asserts err is a *stripe.Error and returns it.
func stripeErr(t testing.TB, err error) *stripe.Error {
	t.Helper()
	var se *stripe.Error
	require.True(t, errors.As(err, &se), "want a *stripe.Error, got %v", err)
	return se
}

// fakeClock is a settable clock for WithClock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// state reads GET /_emulator/state.
func state(t testing.TB, b bundle) (pis []map[string]any, refunds []map[string]any) {
	t.Helper()
	r := get(t, b, "", "/_emulator/state")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var st struct {
		PaymentIntents []map[string]any `json:"payment_intents"`
		Refunds        []map[string]any `json:"refunds"`
	}
	require.NoError(t, json.Unmarshal(r.body, &st))
	require.NotNil(t, st.PaymentIntents, "payment_intents is an array, never null")
	require.NotNil(t, st.Refunds, "refunds is an array, never null")
	return st.PaymentIntents, st.Refunds
}

// waitFor polls cond every 5ms until it holds or 5s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestStored500IsReplayedUntilPruned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Count: 1, Op: stripeemu.OpPICreate}))

	first := post(t, b, apiKey, "k500", "/v1/payment_intents", visaForm)
	require.Equal(t, http.StatusInternalServerError, first.status, string(first.body))
	require.Equal(t, "api_error", decode(t, first.body).Error.Type)
	require.Empty(t, first.header.Get("Stripe-Should-Retry"), "a stored 500 does not invite a retry")

	for range 3 {
		again := post(t, b, apiKey, "k500", "/v1/payment_intents", visaForm)
		require.Equal(t, http.StatusInternalServerError, again.status)
		require.Equal(t, first.body, again.body, "the stored 500 is replayed byte for byte")
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, first.header.Get("Request-Id"), again.header.Get("Original-Request"))
	}
	pis, _ := state(t, b)
	require.Empty(t, pis, "without roll_forward the request never ran")
	require.Empty(t, b.emu.Faults(), "the fault was used once")
	require.Equal(t, "stored_500", b.emu.Requests()[0].Fault)

	r := post(t, b, "", "", "/_emulator/keys/prune", "")
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, `{"pruned":1}`, string(r.body))

	after := post(t, b, apiKey, "k500", "/v1/payment_intents", visaForm)
	require.Equal(t, http.StatusOK, after.status, "a pruned key runs as a new request")
	require.Empty(t, after.header.Get("Idempotent-Replayed"))
	pis, _ = state(t, b)
	require.Len(t, pis, 1)
	require.Equal(t, "succeeded", pis[0]["status"])
}

func TestStored500RolledForwardAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Count: 1, RollForward: stripeemu.RollForwardAfter(0)}))

	first := post(t, b, apiKey, "kr", "/v1/payment_intents", visaForm)
	require.Equal(t, http.StatusInternalServerError, first.status)
	pis, _ := state(t, b)
	require.Len(t, pis, 1, "the request was executed although it answered 500")
	require.Equal(t, "succeeded", pis[0]["status"], "confirmed, as the request asked")
	require.Equal(t, map[string]any{"order_id": "ord_1", "tenant_id": "acme"}, pis[0]["metadata"])
	require.Equal(t, 1, b.emu.Created("kr"))

	again := post(t, b, apiKey, "kr", "/v1/payment_intents", visaForm)
	require.Equal(t, http.StatusInternalServerError, again.status)
	require.Equal(t, first.body, again.body)
	require.Equal(t, 1, b.emu.TotalCreated(), "the replay created nothing")
}

func TestStored500RolledForwardLater(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(1200), Currency: stripe.String("eur"),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(false)})
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusRequiresConfirmation, pi.Status)

	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Count: 1, Op: stripeemu.OpPIConfirm,
		RollForward: stripeemu.RollForwardAfter(20 * time.Millisecond)}))
	params := &stripe.PaymentIntentConfirmParams{}
	params.SetIdempotencyKey("confirm-1")
	_, err = sc.PaymentIntents.Confirm(pi.ID, params)
	require.Equal(t, http.StatusInternalServerError, stripeErr(t, err).HTTPStatusCode)

	waitFor(t, "the confirmation to roll forward", func() bool {
		got, err := sc.PaymentIntents.Get(pi.ID, nil)
		require.NoError(t, err)
		return got.Status == stripe.PaymentIntentStatusSucceeded
	})
	_, err = sc.PaymentIntents.Confirm(pi.ID, params)
	require.Equal(t, http.StatusInternalServerError, stripeErr(t, err).HTTPStatusCode, "the key still replays the 500")
	require.Equal(t, 1, b.emu.TotalCreated())
}

func TestRollForwardDroppedByClose(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Count: 1, RollForward: stripeemu.RollForwardAfter(time.Hour)}))
	require.Equal(t, http.StatusInternalServerError, post(t, b, apiKey, "k", "/v1/payment_intents", visaForm).status)
	b.emu.Close()
	b.emu.Close()
	require.Zero(t, b.emu.TotalCreated())
}

func TestFaultOpFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Count: 1, Status: 503, Op: stripeemu.OpPIConfirm}))
	r := post(t, b, apiKey, "c1", "/v1/payment_intents", "amount=100&currency=usd&payment_method=pm_card_visa")
	require.Equal(t, http.StatusOK, r.status, "a create is not a confirm")
	id := decode(t, r.body).ID
	require.Len(t, b.emu.Faults(), 1)

	r = post(t, b, apiKey, "c2", "/v1/payment_intents/"+id+"/confirm", "")
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, "true", r.header.Get("Stripe-Should-Retry"))
	r = post(t, b, apiKey, "c2", "/v1/payment_intents/"+id+"/confirm", "")
	require.Equal(t, http.StatusOK, r.status, "a 503 is not stored: the same key executes")
	require.Empty(t, r.header.Get("Idempotent-Replayed"))
	require.Equal(t, "succeeded", decode(t, r.body).Status)

	require.Error(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Op: "pi.explode"}))
}

func TestRateLimitAndLockTimeoutAreNotStored(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, code  string
		shouldRetry string
	}{
		{name: "rate limit", code: "rate_limit"},
		{name: "lock timeout", code: "lock_timeout", shouldRetry: "true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			f := stripeemu.Fault{Kind: stripeemu.FaultFail, Count: 1, Status: 429}
			if tt.code == "lock_timeout" {
				f.Code = "lock_timeout"
			}
			require.NoError(t, b.emu.Inject(f))
			r := post(t, b, apiKey, "k", "/v1/payment_intents", visaForm)
			require.Equal(t, http.StatusTooManyRequests, r.status)
			require.Equal(t, tt.code, decode(t, r.body).Error.Code)
			require.Equal(t, tt.shouldRetry, r.header.Get("Stripe-Should-Retry"))
			r = post(t, b, apiKey, "k", "/v1/payment_intents", visaForm)
			require.Equal(t, http.StatusOK, r.status, string(r.body))
			require.Empty(t, r.header.Get("Idempotent-Replayed"))
			require.Equal(t, 1, b.emu.TotalCreated())
		})
	}
	require.Error(t, setup(t).emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 500, Code: "lock_timeout"}))
}

func TestKeysPrunedAfterTTL(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	b := setupWith(t, stripeemu.WithClock(clock.Now), stripeemu.WithKeyTTL(time.Hour))
	first := post(t, b, apiKey, "ttl", "/v1/payment_intents", visaForm)
	require.Equal(t, http.StatusOK, first.status)

	clock.Add(time.Hour - time.Second)
	r := post(t, b, apiKey, "ttl", "/v1/payment_intents", visaForm)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"), "replayed within the TTL")
	require.Equal(t, first.body, r.body)

	clock.Add(time.Second)
	r = post(t, b, apiKey, "ttl", "/v1/payment_intents", visaForm)
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.header.Get("Idempotent-Replayed"), "pruned after the TTL: a new request")
	require.NotEqual(t, decode(t, first.body).ID, decode(t, r.body).ID)
	require.Equal(t, 2, b.emu.Created("ttl"), "the second charge Stripe makes for a key reused after pruning")
}

func TestPaymentIntentLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)

	create := &stripe.PaymentIntentParams{Amount: stripe.Int64(2500), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_visa"), PaymentMethodTypes: stripe.StringSlice([]string{"card"}), Confirm: stripe.Bool(false)}
	create.AddMetadata("order_id", "ord_1")
	pi, err := sc.PaymentIntents.New(create)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusRequiresConfirmation, pi.Status)
	require.Nil(t, pi.LatestCharge)

	pi, err = sc.PaymentIntents.Confirm(pi.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, pi.Status)
	require.Equal(t, int64(2500), pi.AmountReceived)
	require.NotNil(t, pi.LatestCharge)
	require.Regexp(t, `^ch_`, pi.LatestCharge.ID)

	_, err = sc.PaymentIntents.Confirm(pi.ID, nil)
	se := stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodePaymentIntentUnexpectedState, se.Code)

	_, err = sc.PaymentIntents.Cancel(pi.ID, nil)
	se = stripeErr(t, err)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode, "a succeeded PaymentIntent cannot be canceled")
	require.Equal(t, stripe.ErrorCodePaymentIntentUnexpectedState, se.Code)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, se.PaymentIntent.Status)

	got, err := sc.PaymentIntents.Get(pi.ID, &stripe.PaymentIntentParams{Expand: stripe.StringSlice([]string{"latest_charge"})})
	require.NoError(t, err)
	require.Equal(t, int64(2500), got.LatestCharge.Amount)
	require.Equal(t, stripe.ChargeStatusSucceeded, got.LatestCharge.Status)

	other, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_visa")})
	require.NoError(t, err)
	canceled, err := sc.PaymentIntents.Cancel(other.ID, &stripe.PaymentIntentCancelParams{CancellationReason: stripe.String("duplicate")})
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusCanceled, canceled.Status)
	require.Equal(t, stripe.PaymentIntentCancellationReasonDuplicate, canceled.CancellationReason)
	require.NotZero(t, canceled.CanceledAt)
	_, err = sc.PaymentIntents.Confirm(other.ID, nil)
	require.Equal(t, stripe.ErrorCodePaymentIntentUnexpectedState, stripeErr(t, err).Code, "a canceled PaymentIntent cannot be confirmed")

	_, err = sc.PaymentIntents.Get("pi_missing", nil)
	se = stripeErr(t, err)
	require.Equal(t, http.StatusNotFound, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodeResourceMissing, se.Code)
	_, err = stripeClient(t, b, "sk_test_other").PaymentIntents.Get(pi.ID, nil)
	require.Equal(t, http.StatusNotFound, stripeErr(t, err).HTTPStatusCode, "another account's PaymentIntent")

	ch, err := sc.Charges.Get(pi.LatestCharge.ID, nil)
	require.NoError(t, err)
	require.Equal(t, pi.ID, ch.PaymentIntent.ID)
}

func TestDeclineOnConfirm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_chargeDeclinedInsufficientFunds")})
	require.NoError(t, err)
	_, err = sc.PaymentIntents.Confirm(pi.ID, nil)
	se := stripeErr(t, err)
	require.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeCard, se.Type)
	require.Equal(t, stripe.DeclineCodeInsufficientFunds, se.DeclineCode)
	require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, se.PaymentIntent.Status)
	require.Equal(t, stripe.DeclineCodeInsufficientFunds, se.PaymentIntent.LastPaymentError.DeclineCode)

	// A new payment method can be tried on the same PaymentIntent.
	ok, err := sc.PaymentIntents.Confirm(pi.ID, &stripe.PaymentIntentConfirmParams{PaymentMethod: stripe.String("pm_card_mastercard")})
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, ok.Status)
	require.Nil(t, ok.LastPaymentError)
}

func TestUnknownPaymentMethodIsResourceMissing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/v1/payment_intents"} {
		r := post(t, b, apiKey, "u", path, strings.ReplaceAll(visaForm, "pm_card_visa", "pm_1NotATestCard"))
		require.Equal(t, http.StatusBadRequest, r.status, string(r.body))
		var body struct {
			Error struct{ Type, Code, Param, Message string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal(r.body, &body))
		require.Equal(t, "invalid_request_error", body.Error.Type)
		require.Equal(t, "resource_missing", body.Error.Code)
		require.Equal(t, "payment_method", body.Error.Param)
		require.Equal(t, "No such PaymentMethod: 'pm_1NotATestCard'", body.Error.Message)
	}
	require.Zero(t, b.emu.TotalCreated())

	ok := post(t, b, apiKey, "u2", "/v1/payment_intents", "amount=100&currency=usd&payment_method=pm_card_visa")
	id := decode(t, ok.body).ID
	r := post(t, b, apiKey, "", "/v1/payment_intents/"+id+"/confirm", "payment_method=pm_nope")
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, "resource_missing", decode(t, r.body).Error.Code)
}

func TestThreeDSecure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	newPI := func(returnURL string) *stripe.PaymentIntent {
		p := &stripe.PaymentIntentParams{Amount: stripe.Int64(4200), Currency: stripe.String("eur"),
			PaymentMethod: stripe.String("pm_card_authenticationRequired"), Confirm: stripe.Bool(true)}
		if returnURL != "" {
			p.ReturnURL = stripe.String(returnURL)
		}
		pi, err := sc.PaymentIntents.New(p)
		require.NoError(t, err)
		require.Equal(t, stripe.PaymentIntentStatusRequiresAction, pi.Status)
		require.True(t, strings.HasPrefix(pi.ClientSecret, pi.ID+"_secret_"), pi.ClientSecret)
		require.Nil(t, pi.LatestCharge)
		return pi
	}

	sdk := newPI("")
	require.Equal(t, stripe.PaymentIntentNextActionType("use_stripe_sdk"), sdk.NextAction.Type)
	redirect := newPI("https://shop.example/return")
	require.Equal(t, stripe.PaymentIntentNextActionType("redirect_to_url"), redirect.NextAction.Type)
	require.Equal(t, "https://shop.example/return", redirect.NextAction.RedirectToURL.ReturnURL)
	require.NotEmpty(t, redirect.NextAction.RedirectToURL.URL)

	r := post(t, b, "", "", "/_emulator/payment_intents/"+sdk.ID+"/authenticate", `{"outcome":"succeed"}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.Equal(t, "succeeded", decode(t, r.body).Status)
	got, err := sc.PaymentIntents.Get(sdk.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, got.Status)
	require.Nil(t, got.NextAction)
	require.Equal(t, int64(4200), got.AmountReceived)

	r = post(t, b, "", "", "/_emulator/payment_intents/"+redirect.ID+"/authenticate", `{"outcome":"fail"}`)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	got, err = sc.PaymentIntents.Get(redirect.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, got.Status)
	require.Equal(t, stripe.ErrorCode("payment_intent_authentication_failure"), got.LastPaymentError.Code)
	require.Nil(t, got.NextAction)

	require.Equal(t, http.StatusConflict, post(t, b, "", "", "/_emulator/payment_intents/"+sdk.ID+"/authenticate", `{"outcome":"fail"}`).status,
		"only a PaymentIntent in requires_action can be authenticated")
	require.Equal(t, http.StatusNotFound, post(t, b, "", "", "/_emulator/payment_intents/pi_nope/authenticate", `{"outcome":"fail"}`).status)
	require.Equal(t, http.StatusBadRequest, post(t, b, "", "", "/_emulator/payment_intents/"+sdk.ID+"/authenticate", `{"outcome":"maybe"}`).status)

	// A PaymentIntent still in requires_action can be canceled.
	third := newPI("")
	canceled, err := sc.PaymentIntents.Cancel(third.ID, &stripe.PaymentIntentCancelParams{CancellationReason: stripe.String("abandoned")})
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusCanceled, canceled.Status)
}

func TestListNewestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	var ids []string
	for range 5 {
		pi, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd")})
		require.NoError(t, err)
		ids = append(ids, pi.ID)
	}
	_, err := stripeClient(t, b, "sk_test_other").PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd")})
	require.NoError(t, err)

	var listed []string
	params := &stripe.PaymentIntentListParams{}
	params.Limit = stripe.Int64(2)
	it := sc.PaymentIntents.List(params)
	for it.Next() {
		listed = append(listed, it.PaymentIntent().ID)
	}
	require.NoError(t, it.Err())
	require.Equal(t, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}, listed, "newest first, paged by starting_after, this account only")

	r := get(t, b, apiKey, "/v1/payment_intents?limit=2&starting_after="+ids[2])
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var page struct {
		Object  string `json:"object"`
		HasMore bool   `json:"has_more"`
		Data    []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(r.body, &page))
	require.Equal(t, "list", page.Object)
	require.False(t, page.HasMore)
	require.Len(t, page.Data, 2)
	require.Equal(t, ids[1], page.Data[0].ID)
	require.Equal(t, http.StatusNotFound, get(t, b, apiKey, "/v1/payment_intents?starting_after=pi_nope").status)
}

func TestSearchByMetadataLags(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	b := setupWith(t, stripeemu.WithClock(clock.Now), stripeemu.WithSearchLag(2*time.Second))
	sc := stripeClient(t, b, apiKey)
	mk := func(order string) string {
		p := &stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd"),
			PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true)}
		p.AddMetadata("order_id", order)
		p.AddMetadata("tenant_id", "acme")
		pi, err := sc.PaymentIntents.New(p)
		require.NoError(t, err)
		return pi.ID
	}
	search := func(q string) []string {
		params := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: q, Limit: stripe.Int64(1)}}
		it := sc.PaymentIntents.Search(params)
		var out []string
		for it.Next() {
			out = append(out, it.PaymentIntent().ID)
		}
		require.NoError(t, it.Err())
		return out
	}
	a1 := mk("ord_a")
	query := "metadata['order_id']:'ord_a'"
	require.Empty(t, search(query), "not searchable right after creation")
	got, err := sc.PaymentIntents.Get(a1, nil)
	require.NoError(t, err, "GET by id is not lagged")
	require.Equal(t, a1, got.ID)

	clock.Add(2 * time.Second)
	require.Equal(t, []string{a1}, search(query))
	a2 := mk("ord_a")
	mk("ord_b")
	require.Equal(t, []string{a1}, search(query), "the newer one is not indexed yet")
	clock.Add(2 * time.Second)
	require.Equal(t, []string{a2, a1}, search(query), "newest first, paged one by one")
	require.Equal(t, []string{a2, a1}, search(`metadata["order_id"]:"ord_a" AND status:'succeeded' AND metadata['tenant_id']:'acme'`))
	require.Empty(t, search("metadata['order_id']:'ord_a' AND status:'canceled'"))
	require.Len(t, search("metadata['order_id']:'ord_a' OR metadata['order_id']:'ord_b'"), 3)

	for _, bad := range []string{"order_id:'x'", "metadata['order_id']:ord_a", "metadata[order_id]:'x'",
		"status:'a' AND status:'b' OR status:'c'"} {
		r := get(t, b, apiKey, "/v1/payment_intents/search?query="+url.QueryEscape(bad))
		require.Equal(t, http.StatusBadRequest, r.status, bad)
		require.Equal(t, "invalid_request_error", decode(t, r.body).Error.Type)
	}
}

func TestStateHoldsEveryPaymentIntent(t *testing.T) {
	t.Parallel()
	b := setupWith(t, stripeemu.WithSearchLag(time.Hour))
	r1 := post(t, b, apiKey, "s1", "/v1/payment_intents", visaForm)
	r2 := post(t, b, "sk_test_other", "s2", "/v1/payment_intents", strings.ReplaceAll(visaForm, "pm_card_visa", "pm_card_chargeDeclined"))
	pis, refunds := state(t, b)
	require.Empty(t, refunds)
	require.Len(t, pis, 2, "both accounts, not lagged")
	require.Equal(t, decode(t, r1.body).ID, pis[0]["id"])
	require.Equal(t, decode(t, r2.body).Error.PaymentIntent.ID, pis[1]["id"])
	require.Equal(t, "requires_payment_method", pis[1]["status"])
	charge, ok := pis[0]["latest_charge"].(map[string]any)
	require.True(t, ok, "latest_charge is expanded in the state")
	require.Equal(t, float64(0), charge["amount_refunded"])

	goPIs := b.emu.PaymentIntents()
	require.Len(t, goPIs, 2)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, goPIs[0].Status)
	require.Equal(t, "ord_1", goPIs[0].Metadata["order_id"])
	require.Equal(t, int64(2500), goPIs[0].LatestCharge.Amount)
}

// TestDeclineFaultBehindRolledForwardConfirm: a decline fault declines the
// next confirm that executes as Stripe declines a card (402, the
// PaymentIntent back in requires_payment_method with last_payment_error,
// open), while a stored 500's roll-forward executes what it was asked, and
// charges the same PaymentIntent: the sequence that a payment saga must
// survive by closing the PaymentIntent before it gives up.
func TestDeclineFaultBehindRolledForwardConfirm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(1200), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_visa")})
	require.NoError(t, err)
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultStored500, Count: 1, Op: stripeemu.OpPIConfirm,
		RollForward: stripeemu.RollForwardAfter(200 * time.Millisecond)}))
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDecline, Count: 1, Op: stripeemu.OpPIConfirm}))

	first := &stripe.PaymentIntentConfirmParams{}
	first.SetIdempotencyKey("confirm-1")
	_, err = sc.PaymentIntents.Confirm(pi.ID, first)
	require.Equal(t, http.StatusInternalServerError, stripeErr(t, err).HTTPStatusCode)

	second := &stripe.PaymentIntentConfirmParams{}
	second.SetIdempotencyKey("confirm-2")
	_, err = sc.PaymentIntents.Confirm(pi.ID, second)
	se := stripeErr(t, err)
	require.Equal(t, http.StatusPaymentRequired, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorTypeCard, se.Type)
	require.Equal(t, stripe.DeclineCodeGenericDecline, se.DeclineCode)
	require.Equal(t, stripe.PaymentIntentStatusRequiresPaymentMethod, se.PaymentIntent.Status)
	require.Equal(t, stripe.ErrorCodeCardDeclined, se.PaymentIntent.LastPaymentError.Code)

	waitFor(t, "the first confirm to roll forward", func() bool {
		got, err := sc.PaymentIntents.Get(pi.ID, nil)
		require.NoError(t, err)
		return got.Status == stripe.PaymentIntentStatusSucceeded
	})
	for _, r := range b.emu.Requests() {
		if r.IdempotencyKey == "confirm-2" {
			require.Equal(t, "decline", r.Fault, "the log names the fault")
		}
	}

	require.Error(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDecline, Op: stripeemu.OpPICreate}), "only confirms decline")
}

// TestUpdatePaymentIntent: POST /v1/payment_intents/{id}
// (https://docs.stripe.com/api/payment_intents/update) changes a
// PaymentIntent without confirming it. A new payment_method always needs a
// new confirmation, so a PaymentIntent waiting for one (requires_action
// after a 3D Secure card, requires_payment_method after a decline) moves to
// requires_confirmation, where the customer's browser may leave it
// (CONTRACT.md v3, PAYMENT_ACTION_TIMEOUT). Metadata can be changed in any
// status (an empty value unsets a key); anything else only before the
// PaymentIntent succeeds or is canceled (400
// payment_intent_unexpected_state).
func TestUpdatePaymentIntent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := stripeClient(t, b, apiKey)
	pi, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(4200), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_authenticationRequired"), Confirm: stripe.Bool(true)})
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusRequiresAction, pi.Status)

	p := &stripe.PaymentIntentParams{PaymentMethod: stripe.String("pm_card_visa")}
	p.AddMetadata("order_id", "ord_1")
	p.AddMetadata("note", "x")
	p.SetIdempotencyKey("update-1")
	up, err := sc.PaymentIntents.Update(pi.ID, p)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusRequiresConfirmation, up.Status)
	require.Nil(t, up.NextAction)
	require.Equal(t, "pm_card_visa", up.PaymentMethod.ID)
	require.Equal(t, map[string]string{"order_id": "ord_1", "note": "x"}, up.Metadata)
	again, err := sc.PaymentIntents.Update(pi.ID, p)
	require.NoError(t, err)
	require.Equal(t, up.Status, again.Status, "the same key replays")

	unset := &stripe.PaymentIntentParams{}
	unset.AddMetadata("note", "")
	up, err = sc.PaymentIntents.Update(pi.ID, unset)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"order_id": "ord_1"}, up.Metadata)

	_, err = sc.PaymentIntents.Update(pi.ID, &stripe.PaymentIntentParams{PaymentMethod: stripe.String("pm_nope")})
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	require.Equal(t, stripe.ErrorCodeResourceMissing, se.Code)
	// Confirming is confirm's: the update takes neither confirm nor the
	// parameters only create and confirm take.
	for _, form := range []string{"confirm=true", "off_session=true", "return_url=https%3A%2F%2Fshop.example%2F"} {
		r := post(t, b, apiKey, "", "/v1/payment_intents/"+pi.ID, form)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", form, r.body)
		require.Equal(t, "parameter_unknown", decode(t, r.body).Error.Code, form)
	}
	r := post(t, b, apiKey, "", "/v1/payment_intents/"+pi.ID, "receipt_email=buyer%40example.com&shipping[name]=Jo")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.Equal(t, "requires_confirmation", decode(t, r.body).Status)

	paid, err := sc.PaymentIntents.Confirm(pi.ID, nil)
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusSucceeded, paid.Status)
	_, err = sc.PaymentIntents.Update(pi.ID, &stripe.PaymentIntentParams{Amount: stripe.Int64(1)})
	require.ErrorAs(t, err, &se)
	require.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	require.Equal(t, stripe.ErrorCodePaymentIntentUnexpectedState, se.Code)
	late := &stripe.PaymentIntentParams{}
	late.AddMetadata("note", "after")
	up, err = sc.PaymentIntents.Update(pi.ID, late)
	require.NoError(t, err, "metadata in any status")
	require.Equal(t, "after", up.Metadata["note"])
	require.Equal(t, int64(4200), up.Amount)

	declined, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_chargeDeclined")})
	require.NoError(t, err)
	_, err = sc.PaymentIntents.Confirm(declined.ID, nil)
	require.Error(t, err)
	up, err = sc.PaymentIntents.Update(declined.ID, &stripe.PaymentIntentParams{PaymentMethod: stripe.String("pm_card_visa")})
	require.NoError(t, err)
	require.Equal(t, stripe.PaymentIntentStatusRequiresConfirmation, up.Status)
}
