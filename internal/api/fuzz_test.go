package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/onceonly/checkout/internal/ratelimit"
)

// documentedStatus is the status CONTRACT.md gives each problem code that
// POST /v1/checkouts may answer.
var documentedStatus = map[string]int{
	"unauthorized":                 http.StatusUnauthorized,
	"unsupported_media_type":       http.StatusUnsupportedMediaType,
	"payload_too_large":            http.StatusRequestEntityTooLarge,
	"idempotency_key_missing":      http.StatusBadRequest,
	"idempotency_key_invalid":      http.StatusBadRequest,
	"malformed_json":               http.StatusBadRequest,
	"validation_error":             http.StatusBadRequest,
	"idempotency_key_reused":       http.StatusUnprocessableEntity,
	"idempotency_key_in_use":       http.StatusConflict,
	"out_of_stock":                 http.StatusConflict,
	"card_declined":                http.StatusPaymentRequired,
	"payment_rejected":             http.StatusPaymentRequired,
	"rate_limited":                 http.StatusTooManyRequests,
	"payment_provider_unavailable": http.StatusBadGateway,
	"unavailable":                  http.StatusServiceUnavailable,
}

// FuzzCheckout sends POST /v1/checkouts to the real router, on a real test
// database, Redis prefix and Stripe emulator, with random API keys,
// Content-Types, Idempotency-Keys, an extra header of any name, and any
// body. The state carries over from one input to the next, so keys come
// back with other bodies and tenants. After each request:
//   - the answer is never a 500 (nor any 5xx: every dependency is up);
//   - it follows api/openapi.yaml;
//   - an error is a problem+json whose status is the one documented for its
//     code, and whose "status" member says the same;
//   - every order belongs to exactly one key (at most one order per key, no
//     order left behind by a request that was not stored), the emulator
//     holds no more PaymentIntents than there are orders, and no key is
//     left unfinished without a live lease.
//
// Tenant globex is limited to 1/m so that 429s are among the answers.
func FuzzCheckout(f *testing.F) {
	tenants, err := ratelimit.ParseTenantLimits("globex:1/m")
	if err != nil {
		f.Fatal(err)
	}
	h := setup(f, withLimits(ratelimit.Config{Tenants: tenants}))

	const (
		visa      = `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}`
		reordered = "{ \"payment_method\":\"pm_card_visa\",\n\"items\":[{\"quantity\":2.0,\"sku\":\"sku_tee\"}],\"email\":\"buyer@example.com\"}"
	)
	for _, s := range []struct {
		apiKey                uint8
		contentType, key      string
		body                  string
		extraName, extraValue string
	}{
		{0, "application/json", "fz-1", visa, "", ""},
		{0, "application/json", "fz-1", reordered, "", ""},
		{0, "application/json", `"fz-1"`, visa, "X-Request-Id", "r1"},
		{0, "application/json", "fz-1", declinedBody, "", ""},
		{1, "application/json", "fz-1", visa, "", ""},
		{1, "application/json", "fz-2", visa, "", ""},
		{1, "application/json", "fz-3", visa, "", ""},
		{0, "application/json", "fz-4", declinedBody, "", ""},
		{0, "application/json", "fz-5", soldOutBody, "", ""},
		{0, "application/json", "fz-6", `{"email":"a@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_authenticationRequired"}`, "", ""},
		{0, "application/json", "fz-7", `{"email":"a@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_unknown"}`, "", ""},
		{0, "application/json", "fz-8", `{"email":"nope","items":[],"payment_method":""}`, "", ""},
		{0, "application/json; charset=utf-8", "fz-9", `{"email":`, "", ""},
		{0, "text/plain", "fz-10", visa, "", ""},
		{0, "application/json", "", visa, "", ""},
		{0, "application/json", strings.Repeat("k", 256), visa, "", ""},
		{0, "application/json", "fz-11", visa, "Idempotency-Key", "fz-12"},
		{0, "application/json", "fz-13", visa, "Content-Encoding", "gzip"},
		{0, "application/json", "fz-14", visa, "Authorization", "Bearer sk_test_globex"},
		{2, "application/json", "fz-15", visa, "", ""},
		{3, "application/json", "fz-16", visa, "", ""},
		{0, "application/json", "fz-17", `{"email":"a@example.com","items":[{"sku":"sku_tee","quantity":1e0}],"payment_method":"pm_card_visa","x":{"a":1,"a":2}}`, "", ""},
		{0, "application/json", "fz-18", `[` + strings.Repeat(`{"a":[`, 200) + strings.Repeat(`]}`, 200) + `]`, "", ""},
		{0, "application/json", "fz-19", `{"email":"` + strings.Repeat("a", 70<<10) + `"}`, "", ""},
		{0, "application/json", "fz-20", "\"\xff\"", "", ""},
		{0, "application/json", "fz-21", `{"email":"é@example.com","items":[{"sku":"sku_hoodie","quantity":100}],"payment_method":"pm_card_mastercard"}`, "", ""},
	} {
		f.Add(s.apiKey, s.contentType, s.key, []byte(s.body), s.extraName, s.extraValue)
	}

	apiKeys := []string{"Bearer sk_test_acme", "Bearer sk_test_globex", "", "Bearer sk_test_nope"}
	f.Fuzz(func(t *testing.T, apiKey uint8, contentType, key string, body []byte, extraName, extraValue string) {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/checkouts", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if a := apiKeys[int(apiKey)%len(apiKeys)]; a != "" {
			req.Header.Set("Authorization", a)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		if extraName != "" {
			req.Header[extraName] = append(req.Header[extraName], extraValue)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			// The client refused to send it (a header no HTTP/1.1 message
			// can carry): nothing reached the server.
			if strings.Contains(err.Error(), "invalid header") || strings.Contains(err.Error(), "invalid method") {
				return
			}
			t.Fatalf("request failed: %v", err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		r := reply{status: resp.StatusCode, header: resp.Header, body: b}
		if r.status >= 500 {
			t.Fatalf("%d: %s", r.status, b)
		}
		checkAgainstSpec(t, req, r)
		if r.status >= 400 {
			if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("%d with Content-Type %q: %s", r.status, ct, b)
			}
			var p struct {
				Type   string `json:"type"`
				Title  string `json:"title"`
				Status int    `json:"status"`
				Code   string `json:"code"`
			}
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatalf("problem body %q: %v", b, err)
			}
			want, documented := documentedStatus[p.Code]
			switch {
			case !documented:
				t.Fatalf("undocumented code %q (%d)", p.Code, r.status)
			case want != r.status || p.Status != r.status:
				t.Fatalf("code %s answered %d (body says %d), documented %d", p.Code, r.status, p.Status, want)
			case p.Title == "" || !strings.HasSuffix(p.Type, "/"+p.Code):
				t.Fatalf("ill-formed problem %s", b)
			}
		}

		checkInvariants(t, h)
	})
}

// checkInvariants checks the state after a request has been answered.
func checkInvariants(t *testing.T, h *harness) {
	t.Helper()
	count := func(q string) int {
		var n int64
		if err := h.db.Raw(q).Scan(&n).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return int(n)
	}
	if n := count(`SELECT count(*) FROM orders o
		LEFT JOIN (SELECT order_id, count(*) AS keys FROM idempotency_keys WHERE order_id IS NOT NULL GROUP BY order_id) k
		ON k.order_id = o.id WHERE k.keys IS DISTINCT FROM 1`); n != 0 {
		t.Fatalf("%d orders not owned by exactly one key", n)
	}
	if n := count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point <> 'finished'
		AND (lease_expires_at IS NULL OR lease_expires_at <= now())`); n != 0 {
		t.Fatalf("%d keys unfinished without a live lease", n)
	}
	if orders, pis := count(`SELECT count(*) FROM orders`), h.emu.TotalCreated(); pis > orders {
		t.Fatalf("%d PaymentIntents for %d orders", pis, orders)
	}
}
