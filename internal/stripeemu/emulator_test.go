package stripeemu_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/onceonly/checkout/internal/stripeemu"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// bundle is what every test gets: an emulator behind a real HTTP server.
type bundle struct {
	emu *stripeemu.Emulator
	url string
}

func setup(t testing.TB) bundle {
	t.Helper()
	return setupWith(t)
}

// setupWith is setup with options; the emulator is closed after the server.
func setupWith(t testing.TB, opts ...stripeemu.Option) bundle {
	t.Helper()
	emu := stripeemu.New(opts...)
	srv := httptest.NewServer(emu)
	t.Cleanup(emu.Close)
	t.Cleanup(srv.Close)
	return bundle{emu: emu, url: srv.URL}
}

// reply is a response read in full.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// post sends a form to path with the API key and idempotency key ("" for none).
func post(t testing.TB, b bundle, apiKey, idemKey, path string, form string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url+path, strings.NewReader(form))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	return do(t, req)
}

func get(t testing.TB, b bundle, apiKey, path string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.url+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	return do(t, req)
}

func do(t testing.TB, req *http.Request) reply {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return reply{status: res.StatusCode, header: res.Header, body: body}
}

// decode reads a PaymentIntent or a Stripe error from a body.
type decoded struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Amount int64  `json:"amount"`
	Error  *struct {
		Type          string `json:"type"`
		Code          string `json:"code"`
		DeclineCode   string `json:"decline_code"`
		PaymentIntent *struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"payment_intent"`
	} `json:"error"`
}

func decode(t testing.TB, body []byte) decoded {
	t.Helper()
	var d decoded
	require.NoError(t, json.Unmarshal(body, &d), string(body))
	return d
}

const (
	apiKey   = "sk_test_123"
	visaForm = "amount=2500&currency=usd&payment_method=pm_card_visa&confirm=true&payment_method_types[0]=card&metadata[order_id]=ord_1&metadata[tenant_id]=acme"
)

func TestCreate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		apiKey     string
		form       string
		wantStatus int
		wantPI     string // PaymentIntent status, in the body or the error's payment_intent
		wantCode   string
		wantCreate int
	}{
		{name: "succeeded with confirm", apiKey: apiKey, form: visaForm, wantStatus: 200, wantPI: "succeeded", wantCreate: 1},
		{name: "requires confirmation without confirm", apiKey: apiKey, form: "amount=100&currency=usd&payment_method=pm_card_visa", wantStatus: 200, wantPI: "requires_confirmation", wantCreate: 1},
		{name: "requires action for 3DS card", apiKey: apiKey, form: "amount=100&currency=usd&payment_method=pm_card_authenticationRequired&confirm=true", wantStatus: 200, wantPI: "requires_action", wantCreate: 1},
		{name: "declined 402 with payment intent", apiKey: apiKey, form: strings.ReplaceAll(visaForm, "pm_card_visa", "pm_card_chargeDeclined"), wantStatus: 402, wantPI: "requires_payment_method", wantCode: "card_declined", wantCreate: 1},
		{name: "declined visa variant", apiKey: apiKey, form: strings.ReplaceAll(visaForm, "pm_card_visa", "pm_card_visa_chargeDeclined"), wantStatus: 402, wantPI: "requires_payment_method", wantCode: "card_declined", wantCreate: 1},
		{name: "unauthorized without key", form: visaForm, wantStatus: 401},
		{name: "unauthorized with non-secret key", apiKey: "pk_test_123", form: visaForm, wantStatus: 401, wantCode: "api_key_invalid"},
		{name: "bad request without amount", apiKey: apiKey, form: "currency=usd", wantStatus: 400, wantCode: "parameter_missing"},
		{name: "bad request with unknown parameter", apiKey: apiKey, form: visaForm + "&colour=red", wantStatus: 400, wantCode: "parameter_unknown"},
		{name: "bad request confirming without payment method", apiKey: apiKey, form: "amount=100&currency=usd&confirm=true", wantStatus: 400, wantCode: "payment_intent_unexpected_state"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := post(t, b, tt.apiKey, "k1", "/v1/payment_intents", tt.form)
			require.Equal(t, tt.wantStatus, r.status, string(r.body))
			require.Equal(t, "application/json", r.header.Get("Content-Type"))
			require.Empty(t, r.header.Get("Idempotent-Replayed"), "a first response is not a replay")
			d := decode(t, r.body)
			switch {
			case r.status == 200:
				require.True(t, strings.HasPrefix(d.ID, "pi_"), d.ID)
				require.Equal(t, tt.wantPI, d.Status)
			case tt.wantPI != "":
				require.Equal(t, "card_error", d.Error.Type)
				require.Equal(t, tt.wantCode, d.Error.Code)
				require.Equal(t, "generic_decline", d.Error.DeclineCode)
				require.NotNil(t, d.Error.PaymentIntent)
				require.True(t, strings.HasPrefix(d.Error.PaymentIntent.ID, "pi_"))
				require.Equal(t, tt.wantPI, d.Error.PaymentIntent.Status)
			default:
				require.NotNil(t, d.Error)
				require.Equal(t, "invalid_request_error", d.Error.Type)
				require.Equal(t, tt.wantCode, d.Error.Code)
			}
			require.Equal(t, tt.wantCreate, b.emu.Created("k1"))
			require.Equal(t, tt.wantCreate, b.emu.TotalCreated())
			require.Len(t, b.emu.Requests(), 1)
			require.Equal(t, tt.wantStatus, b.emu.Requests()[0].Status)
		})
	}
}

func TestIdempotency(t *testing.T) {
	t.Parallel()
	declined := strings.ReplaceAll(visaForm, "pm_card_visa", "pm_card_chargeDeclined")
	reordered := "metadata[tenant_id]=acme&payment_method_types[0]=card&confirm=true&metadata[order_id]=ord_1&currency=usd&payment_method=pm_card_visa&amount=2500"
	tests := []struct {
		name         string
		first        string
		second       string
		secondAPIKey string
		wantStatus   int
		wantReplayed bool
		wantCreated  int
	}{
		{name: "replayed byte for byte with same params", first: visaForm, second: visaForm, wantStatus: 200, wantReplayed: true, wantCreated: 1},
		{name: "replayed with same params in another order", first: visaForm, second: reordered, wantStatus: 200, wantReplayed: true, wantCreated: 1},
		{name: "decline replayed byte for byte", first: declined, second: declined, wantStatus: 402, wantReplayed: true, wantCreated: 1},
		{name: "idempotency error with other amount", first: visaForm, second: strings.Replace(visaForm, "2500", "2600", 1), wantStatus: 400, wantCreated: 1},
		{name: "idempotency error with other metadata", first: visaForm, second: strings.Replace(visaForm, "ord_1", "ord_2", 1), wantStatus: 400, wantCreated: 1},
		{name: "new payment intent under another api key", first: visaForm, second: visaForm, secondAPIKey: "sk_test_other", wantStatus: 200, wantCreated: 2},
		{name: "executed after failed validation stored nothing", first: "currency=usd", second: visaForm, wantStatus: 200, wantCreated: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			second := tt.secondAPIKey
			if second == "" {
				second = apiKey
			}
			r1 := post(t, b, apiKey, "key-1", "/v1/payment_intents", tt.first)
			r2 := post(t, b, second, "key-1", "/v1/payment_intents", tt.second)
			require.Equal(t, tt.wantStatus, r2.status, string(r2.body))
			if tt.wantReplayed {
				require.Equal(t, "true", r2.header.Get("Idempotent-Replayed"))
				require.Equal(t, r1.header.Get("Request-Id"), r2.header.Get("Original-Request"))
				require.Equal(t, r1.body, r2.body, "a replay is the stored body byte for byte")
				require.True(t, b.emu.Requests()[1].Replayed)
			} else {
				require.Empty(t, r2.header.Get("Idempotent-Replayed"))
			}
			if tt.wantStatus == 400 && r1.status == 200 {
				require.Equal(t, "idempotency_error", decode(t, r2.body).Error.Type)
			}
			require.Equal(t, tt.wantCreated, b.emu.Created("key-1"))
		})
	}
}

func TestConcurrentSameKeyCreatesOnePaymentIntent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Keep the first request executing long enough for the others to collide.
	require.NoError(t, b.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 200 * time.Millisecond}))

	const n = 50
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = post(t, b, apiKey, "same", "/v1/payment_intents", visaForm) })
	}
	wg.Wait()

	ids := map[string]bool{}
	for _, r := range replies {
		require.Contains(t, []int{200, 409}, r.status, string(r.body))
		if r.status == 200 {
			ids[decode(t, r.body).ID] = true
		} else {
			require.Equal(t, "idempotency_key_in_use", decode(t, r.body).Error.Code)
		}
	}
	require.Len(t, ids, 1, "every 200 carries the same PaymentIntent")
	require.Equal(t, 1, b.emu.Created("same"))
	require.Equal(t, 1, b.emu.TotalCreated())
	require.Zero(t, b.emu.InFlight())
}

func TestConcurrentDistinctKeysCreateOneEach(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := post(t, b, apiKey, "key-"+string(rune('A'+i)), "/v1/payment_intents", visaForm)
			require.Equal(t, 200, r.status)
		})
	}
	wg.Wait()
	require.Equal(t, n, b.emu.TotalCreated())
	for k, c := range b.emu.Stats().CreatedByKey {
		require.Equal(t, 1, c, k)
	}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		fault       stripeemu.Fault
		wantStatus  []int // per request, 0 = connection dropped
		wantCreated int
		wantFault   string
	}{
		{name: "failed twice then created once", fault: stripeemu.Fault{Kind: stripeemu.FaultFail, Count: 2, Status: 503}, wantStatus: []int{503, 503, 200}, wantCreated: 1, wantFault: "fail"},
		{name: "rate limited once", fault: stripeemu.Fault{Kind: stripeemu.FaultFail, Count: 1, Status: 429}, wantStatus: []int{429, 200}, wantCreated: 1, wantFault: "fail"},
		{name: "failed every request", fault: stripeemu.Fault{Kind: stripeemu.FaultFail}, wantStatus: []int{500, 500, 500}, wantCreated: 0, wantFault: "fail"},
		{name: "dropped after executing then replayed", fault: stripeemu.Fault{Kind: stripeemu.FaultDrop, Count: 1}, wantStatus: []int{0, 200}, wantCreated: 1, wantFault: "drop"},
		{name: "delayed after executing", fault: stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, After: 50 * time.Millisecond}, wantStatus: []int{200, 200}, wantCreated: 1, wantFault: "delay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			require.NoError(t, b.emu.Inject(tt.fault))
			for i, want := range tt.wantStatus {
				req, err := http.NewRequest(http.MethodPost, b.url+"/v1/payment_intents", strings.NewReader(visaForm))
				require.NoError(t, err)
				req.Header.Set("Authorization", "Bearer "+apiKey)
				req.Header.Set("Idempotency-Key", "fk")
				res, err := http.DefaultClient.Do(req)
				if want == 0 {
					require.Error(t, err, "request %d: the connection is dropped", i)
					continue
				}
				require.NoError(t, err)
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				require.Equal(t, want, res.StatusCode, "request %d: %s", i, body)
				if want >= 500 {
					require.Equal(t, "api_error", decode(t, body).Error.Type)
				}
			}
			require.Equal(t, tt.wantCreated, b.emu.Created("fk"))
			require.Equal(t, tt.wantFault, b.emu.Requests()[0].Fault)
		})
	}
}

func TestInjectRejectsInvalidFault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, f := range []stripeemu.Fault{
		{Kind: "explode"},
		{Kind: stripeemu.FaultFail, Status: 302},
		{Kind: stripeemu.FaultDelay},
		{Kind: stripeemu.FaultDrop, Count: -1},
	} {
		require.Error(t, b.emu.Inject(f), "%+v", f)
	}
	require.Empty(t, b.emu.Faults())
}

func TestAdminOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)

	r := post(t, b, "", "", "/_emulator/faults", `[{"kind":"fail","count":1,"status":502},{"kind":"delay","count":1,"before":"10ms","after":"5ms"}]`)
	require.Equal(t, http.StatusNoContent, r.status, string(r.body))
	r = post(t, b, "", "", "/_emulator/faults", `{"kind":"nope"}`)
	require.Equal(t, http.StatusBadRequest, r.status)
	r = post(t, b, "", "", "/_emulator/faults", `{"kind":"delay","before":"soon"}`)
	require.Equal(t, http.StatusBadRequest, r.status)
	// One bad fault in an array refuses the whole array: none is added.
	r = post(t, b, "", "", "/_emulator/faults", `[{"kind":"fail","count":1,"status":503},{"kind":"nope"}]`)
	require.Equal(t, http.StatusBadRequest, r.status)

	r = get(t, b, "", "/_emulator/faults")
	var faults []stripeemu.Fault
	require.NoError(t, json.Unmarshal(r.body, &faults))
	require.Equal(t, []stripeemu.Fault{
		{Kind: stripeemu.FaultFail, Count: 1, Status: 502},
		{Kind: stripeemu.FaultDelay, Count: 1, Before: 10 * time.Millisecond, After: 5 * time.Millisecond},
	}, faults)

	require.Equal(t, 502, post(t, b, apiKey, "ak", "/v1/payment_intents", visaForm).status)
	created := post(t, b, apiKey, "ak", "/v1/payment_intents", visaForm)
	require.Equal(t, 200, created.status)
	pi := decode(t, created.body)

	got := get(t, b, apiKey, "/v1/payment_intents/"+pi.ID)
	require.Equal(t, 200, got.status)
	require.Equal(t, pi.ID, decode(t, got.body).ID)
	require.Equal(t, 404, get(t, b, "sk_test_other", "/v1/payment_intents/"+pi.ID).status, "another account's PaymentIntent")
	require.Equal(t, 404, get(t, b, apiKey, "/v1/charges").status)

	r = get(t, b, "", "/_emulator/stats")
	require.Equal(t, 200, r.status)
	var stats stripeemu.Stats
	require.NoError(t, json.NewDecoder(bytes.NewReader(r.body)).Decode(&stats))
	require.Equal(t, 1, stats.PaymentIntentsCreated)
	require.Equal(t, map[string]int{"ak": 1}, stats.CreatedByKey)
	require.Len(t, stats.Requests, 5)
	first := stats.Requests[0]
	require.Equal(t, stripeemu.Request{Method: "POST", Path: "/v1/payment_intents", Op: stripeemu.OpPICreate, IdempotencyKey: "ak",
		Params: mustCanonical(t, visaForm), Status: 502, Fault: "fail"}, first)
	require.Equal(t, "delay", stats.Requests[1].Fault)
	require.Equal(t, pi.ID, stats.Requests[1].PaymentIntentID)

	r = post(t, b, "", "", "/_emulator/reset", "")
	require.Equal(t, http.StatusNoContent, r.status)
	require.Equal(t, stripeemu.Stats{CreatedByKey: map[string]int{}, Requests: []stripeemu.Request{}}, b.emu.Stats())
	require.Equal(t, 200, post(t, b, apiKey, "ak", "/v1/payment_intents", strings.Replace(visaForm, "2500", "1", 1)).status,
		"after a reset the key is new")
}

func mustCanonical(t testing.TB, form string) string {
	t.Helper()
	v, err := url.ParseQuery(form)
	require.NoError(t, err)
	return v.Encode()
}
