package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/orders"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripeintent"
	"github.com/onceonly/checkout/internal/testenv"
)

const (
	teeBody      = `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}`
	declinedBody = `{"email":"buyer@example.com","items":[{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_chargeDeclined"}`
	soldOutBody  = `{"email":"buyer@example.com","items":[{"sku":"sku_sold_out","quantity":1}],"payment_method":"pm_card_visa"}`
)

type problemBody struct {
	Type    string                `json:"type"`
	Title   string                `json:"title"`
	Status  int                   `json:"status"`
	Detail  string                `json:"detail"`
	Code    string                `json:"code"`
	OrderID string                `json:"order_id"`
	Errors  []checkout.FieldError `json:"errors"`
}

func decodeProblem(t testing.TB, r reply) problemBody {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), "body: %s", r.body)
	var p problemBody
	require.NoError(t, json.Unmarshal(r.body, &p))
	require.Equal(t, r.status, p.Status)
	require.NotEmpty(t, p.Title)
	require.True(t, strings.HasSuffix(p.Type, "/"+p.Code))
	return p
}

func decodeOrder(t testing.TB, r reply) orders.Order {
	t.Helper()
	var o orders.Order
	require.NoError(t, json.Unmarshal(r.body, &o), "body: %s", r.body)
	return o
}

// TestOutcomes covers the contract's outcome table: each outcome is stored
// under the key and replayed byte for byte with Idempotent-Replayed: true.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	h := setup(t)

	t.Run("paid", func(t *testing.T) {
		first := h.checkout("paid-1", teeBody)
		require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
		require.Empty(t, first.header.Get(idempotency.ReplayedHeader))
		o := decodeOrder(t, first)
		require.Equal(t, "/v1/orders/"+o.ID, first.header.Get("Location"))
		require.Equal(t, orders.Paid, o.Status)
		require.EqualValues(t, 5000, o.AmountTotal)
		require.Equal(t, "usd", o.Currency)
		require.Equal(t, []orders.OrderItem{{SKU: "sku_tee", Quantity: 2, UnitAmount: 2500, Amount: 5000}}, o.Items)
		require.Equal(t, "stripe", o.Payment.Provider)
		require.True(t, strings.HasPrefix(o.Payment.PaymentIntentID, "pi_"))
		require.Equal(t, stripeintent.Succeeded, o.Payment.Status)

		again := h.checkout("paid-1", teeBody)
		require.Equal(t, first.status, again.status)
		require.Equal(t, string(first.body), string(again.body))
		require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))

		require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
		require.Equal(t, 1, h.emu.TotalCreated())
		require.Equal(t, 2, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ?`, o.ID)) // created + paid
		require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.paid'`, o.ID))

		got := h.get("sk_test_acme", "/v1/orders/"+o.ID)
		require.Equal(t, http.StatusOK, got.status)
		var view struct {
			orders.Order
			Notifications []notify.View `json:"notifications"`
		}
		require.NoError(t, json.Unmarshal(got.body, &view))
		require.Equal(t, o.ID, view.ID)
		require.NotNil(t, view.Notifications)
	})

	t.Run("card declined", func(t *testing.T) {
		before := h.stock("sku_tee")
		created := h.emu.TotalCreated()
		first := h.checkout("declined-1", declinedBody)
		require.Equal(t, http.StatusPaymentRequired, first.status, "%s", first.body)
		p := decodeProblem(t, first)
		require.Equal(t, "card_declined", p.Code)
		require.NotEmpty(t, p.OrderID)
		require.Equal(t, before, h.stock("sku_tee"), "a declined payment gives its stock back")
		require.Equal(t, 1, h.count(`SELECT count(*) FROM orders WHERE id = ? AND status = 'payment_failed'`, p.OrderID))
		require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE aggregate_id = ? AND type = 'order.payment_failed'`, p.OrderID))
		require.Equal(t, created+1, h.emu.TotalCreated())

		again := h.checkout("declined-1", declinedBody)
		require.Equal(t, string(first.body), string(again.body))
		require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, created+1, h.emu.TotalCreated())
	})

	t.Run("out of stock", func(t *testing.T) {
		orders, created := h.count(`SELECT count(*) FROM orders`), h.emu.TotalCreated()
		first := h.checkout("soldout-1", soldOutBody)
		require.Equal(t, http.StatusConflict, first.status, "%s", first.body)
		require.Equal(t, "out_of_stock", decodeProblem(t, first).Code)
		require.Empty(t, first.header.Get(idempotency.ReplayedHeader))
		again := h.checkout("soldout-1", soldOutBody)
		require.Equal(t, string(first.body), string(again.body))
		require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, orders, h.count(`SELECT count(*) FROM orders`), "no order")
		require.Equal(t, created, h.emu.TotalCreated(), "no charge")
	})
}

// TestRequestChecks covers the checks before the stored-key rules, in the
// contract's order; none of their answers is stored.
func TestRequestChecks(t *testing.T) {
	t.Parallel()
	h := setup(t)
	post := func(apiKey, contentType, key, body string) reply {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/checkouts", strings.NewReader(body))
		require.NoError(t, err)
		if apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+apiKey)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		return h.send(req)
	}
	big := `{"email":"` + strings.Repeat("a", 70<<10) + `"}`
	tests := []struct {
		name                           string
		apiKey, contentType, key, body string
		status                         int
		code                           string
	}{
		{"no api key is 401 before anything else", "", "text/plain", "", "{", 401, "unauthorized"},
		{"unknown api key is 401", "sk_test_nope", "application/json", "k", teeBody, 401, "unauthorized"},
		{"non-JSON content type is 415", "sk_test_acme", "text/plain", "", teeBody, 415, "unsupported_media_type"},
		{"body over 64 KiB is 413 before the key check", "sk_test_acme", "application/json", "", big, 413, "payload_too_large"},
		{"missing key is 400", "sk_test_acme", "application/json", "", teeBody, 400, "idempotency_key_missing"},
		{"key over 255 characters is 400", "sk_test_acme", "application/json", strings.Repeat("k", 256), teeBody, 400, "idempotency_key_invalid"},
		{"key with a non-ASCII byte is 400", "sk_test_acme", "application/json", "kéy", teeBody, 400, "idempotency_key_invalid"},
		{"malformed JSON is 400 after the key", "sk_test_acme", "application/json", "checks-1", `{"email":`, 400, "malformed_json"},
		{"JSON with a duplicate member is malformed", "sk_test_acme", "application/json", "checks-1", `{"email":"a@b.co","email":"c@d.co"}`, 400, "malformed_json"},
		{"charset parameter is accepted", "sk_test_acme", "application/json; charset=utf-8", "checks-2", teeBody, 201, ""},
		{"a charset other than UTF-8 is 415", "sk_test_acme", "application/json; charset=latin1", "checks-3", teeBody, 415, "unsupported_media_type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(tc.apiKey, tc.contentType, tc.key, tc.body)
			require.Equal(t, tc.status, r.status, "%s", r.body)
			if tc.code != "" {
				require.Equal(t, tc.code, decodeProblem(t, r).Code)
			}
		})
	}
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys`), "only the 201 is stored")
}

// TestValidation: validation errors list every bad field, are not stored,
// and the fixed request then succeeds with the same key.
func TestValidation(t *testing.T) {
	t.Parallel()
	h := setup(t)
	tests := []struct {
		name   string
		body   string
		fields []string
	}{
		{"every field wrong at once", `{"email":"nope","items":[{"sku":"sku_tee","quantity":0},{"sku":"sku_unknown","quantity":1}],"payment_method":""}`,
			[]string{"email", "items[0].quantity", "payment_method", "items[1].sku"}},
		{"no items", `{"email":"a@example.com","items":[],"payment_method":"pm_card_visa"}`, []string{"items"}},
		{"51 items", `{"email":"a@example.com","items":[` + strings.TrimSuffix(strings.Repeat(`{"sku":"sku_mug","quantity":1},`, 51), ",") + `],"payment_method":"pm_card_visa"}`, []string{"items"}},
		{"quantity over 100", `{"email":"a@example.com","items":[{"sku":"sku_mug","quantity":101}],"payment_method":"pm_card_visa"}`, []string{"items[0].quantity"}},
		{"unknown fields", `{"email":"a@example.com","items":[{"sku":"sku_mug","quantity":1,"price":1}],"payment_method":"pm_card_visa","coupon":"x"}`, []string{"coupon", "items[0].price"}},
		{"wrong type, at its own path", `{"email":"a@example.com","items":[{"sku":"sku_mug","quantity":"1"}],"payment_method":"pm_card_visa"}`, []string{"items[0].quantity"}},
		{"a fraction", `{"email":"a@example.com","items":[{"sku":"sku_mug","quantity":1.5}],"payment_method":"pm_card_visa"}`, []string{"items[0].quantity"}},
		{"unknown field beside other errors", `{"email":"a@example.com","items":[{"sku":"sku_nope","quantity":0}],"payment_method":"pm_card_visa","extra":1}`,
			[]string{"extra", "items[0].quantity", "items[0].sku"}},
		{"items not an array", `{"email":"a@example.com","items":{},"payment_method":"pm_card_visa"}`, []string{"items"}},
		{"an item not an object", `{"email":"a@example.com","items":[3],"payment_method":"pm_card_visa"}`, []string{"items[0]"}},
		{"null body", `null`, []string{""}},
		{"NUL byte in the payment method", `{"email":"a@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_visa\u0000"}`, []string{"payment_method"}},
		{"NUL byte in a sku", `{"email":"a@example.com","items":[{"sku":"sku_mug\u0000","quantity":1}],"payment_method":"pm_card_visa"}`, []string{"items[0].sku"}},
		{"control character in the email", `{"email":"a\u0000b@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_visa"}`, []string{"email"}},
		{"display-name email", `{"email":"Bob <bob@example.com>","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_visa"}`, []string{"email"}},
		{"not an object", `[1,2]`, []string{""}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("validation-%d", i)
			r := h.checkout(key, tc.body)
			require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
			p := decodeProblem(t, r)
			require.Equal(t, "validation_error", p.Code)
			var fields []string
			for _, e := range p.Errors {
				fields = append(fields, e.Field)
				require.NotEmpty(t, e.Message)
				require.NotContains(t, e.Message, "checkout.", "no Go type names")
			}
			require.ElementsMatch(t, tc.fields, fields)

			fixed := h.checkout(key, teeBody)
			require.Equal(t, http.StatusCreated, fixed.status, "the key is free after a validation error: %s", fixed.body)
			require.Empty(t, fixed.header.Get(idempotency.ReplayedHeader))
		})
	}
}

// TestFingerprint: the same JSON in another form replays; another payload
// is 422 and executes nothing.
func TestFingerprint(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.checkout("fp-1", teeBody)
	require.Equal(t, http.StatusCreated, first.status)

	reordered := "{ \"payment_method\" : \"pm_card_visa\",\n \"items\":[ {\"quantity\":2, \"sku\":\"sku_tee\"} ],\t\"email\":\"buyer@example.com\" }"
	again := h.checkout("fp-1", reordered)
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, string(first.body), string(again.body))

	stock := h.stock("sku_tee")
	other := h.checkout("fp-1", strings.Replace(teeBody, `"quantity":2`, `"quantity":3`, 1))
	require.Equal(t, http.StatusUnprocessableEntity, other.status)
	require.Equal(t, "idempotency_key_reused", decodeProblem(t, other).Code)
	require.Empty(t, other.header.Get(idempotency.ReplayedHeader))

	// Also from Postgres alone, with the Redis cache gone.
	h.flushRedis()
	other = h.checkout("fp-1", strings.Replace(teeBody, `"quantity":2`, `"quantity":3`, 1))
	require.Equal(t, http.StatusUnprocessableEntity, other.status)

	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
	require.Equal(t, 1, h.emu.TotalCreated())
	require.Equal(t, stock, h.stock("sku_tee"))
}

func (h *harness) flushRedis() {
	h.t.Helper()
	ctx := context.Background()
	iter := h.rdb.Scan(ctx, 0, h.prefix+"*", 500).Iterator()
	n := 0
	for iter.Next(ctx) {
		require.NoError(h.t, h.rdb.Del(ctx, iter.Val()).Err())
		n++
	}
	require.NoError(h.t, iter.Err())
}

// TestTenantScope: the same key from another tenant is another request and
// never sees the first tenant's response or order.
func TestTenantScope(t *testing.T) {
	t.Parallel()
	h := setup(t)
	acme := h.do(context.Background(), "sk_test_acme", "shared-key", teeBody)
	globex := h.do(context.Background(), "sk_test_globex", "shared-key", teeBody)
	require.Equal(t, http.StatusCreated, acme.status)
	require.Equal(t, http.StatusCreated, globex.status)
	require.Empty(t, globex.header.Get(idempotency.ReplayedHeader))
	a, g := decodeOrder(t, acme), decodeOrder(t, globex)
	require.NotEqual(t, a.ID, g.ID)
	require.NotEqual(t, a.Payment.PaymentIntentID, g.Payment.PaymentIntentID)
	require.Equal(t, 2, h.emu.TotalCreated())

	require.Equal(t, http.StatusNotFound, h.get("sk_test_globex", "/v1/orders/"+a.ID).status)
	require.Equal(t, "not_found", decodeProblem(t, h.get("sk_test_globex", "/v1/orders/"+a.ID)).Code)
	require.Equal(t, http.StatusOK, h.get("sk_test_acme", "/v1/orders/"+a.ID).status)
}

// TestConcurrentDuplicates: 50 identical requests at once, over 20 rounds:
// one order and one PaymentIntent per key; every other answer is a 409 with
// Retry-After or an identical replay; never a 500.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const rounds, parallel = 20, 50
	for round := range rounds {
		key := fmt.Sprintf("storm-%d", round)
		replies := make([]reply, parallel)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				replies[i] = h.checkout(key, teeBody)
			}()
		}
		close(start)
		wg.Wait()

		var created []byte
		for _, r := range replies {
			if r.status == http.StatusCreated && r.header.Get(idempotency.ReplayedHeader) == "" {
				require.Nil(t, created, "round %d: two first responses", round)
				created = r.body
			}
		}
		for _, r := range replies {
			switch r.status {
			case http.StatusCreated:
				if created != nil {
					require.Equal(t, string(created), string(r.body))
				}
			case http.StatusConflict:
				require.Equal(t, "idempotency_key_in_use", decodeProblem(t, r).Code)
				require.Equal(t, "1", r.header.Get("Retry-After"))
			default:
				t.Fatalf("round %d: unexpected %d: %s", round, r.status, r.body)
			}
		}
		final := h.checkout(key, teeBody)
		require.Equal(t, http.StatusCreated, final.status)
		o := decodeOrder(t, final)
		require.Len(t, h.intents(o.ID), 1, "round %d", round)
	}
	require.Equal(t, rounds, h.count(`SELECT count(*) FROM orders`))
	require.Equal(t, rounds, h.emu.TotalCreated())
}

// TestStripeDownThenResume: Stripe down beyond the client's retries gives
// 502 with Retry-After and stores nothing final; the retry with the same key
// resumes the same order and charges once.
func TestStripeDownThenResume(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 503})) // every request
	r := h.checkout("down-1", teeBody)
	require.Equal(t, http.StatusBadGateway, r.status, "%s", r.body)
	require.Equal(t, "payment_provider_unavailable", decodeProblem(t, r).Code)
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'order_created'`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders WHERE status = 'pending_payment'`))
	require.Equal(t, 0, h.emu.TotalCreated())

	h.emu.ClearFaults()
	retry := h.checkout("down-1", teeBody)
	require.Equal(t, http.StatusCreated, retry.status, "%s", retry.body)
	require.Empty(t, retry.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`), "resumed, not re-run")
	require.Equal(t, 1, h.emu.TotalCreated())
	require.Equal(t, 1, h.count(`SELECT count(*) FROM outbox WHERE type = 'order.created'`))
}

// TestClientDisconnect: a client that gives up mid-request does not abort
// the work; no PaymentIntent exists without its order; the retry replays.
func TestClientDisconnect(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 300 * time.Millisecond, After: 300 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/checkouts", strings.NewReader(teeBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.Set("Idempotency-Key", "disconnect-1")
	req.Header.Set("Content-Type", "application/json")
	_, err = http.DefaultClient.Do(req)
	require.Error(t, err, "the client gave up")

	eventually(t, "the abandoned checkout to finish", func() bool {
		return h.count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished'`) == 1
	})
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders WHERE status = 'paid'`))
	require.Equal(t, 1, h.emu.TotalCreated())
	// Between the commit and the release of the Redis lease a retry may
	// still get 409; a client retries that, as Retry-After says.
	var retry reply
	eventually(t, "the retry to get a final answer", func() bool {
		retry = h.checkout("disconnect-1", teeBody)
		return retry.status != http.StatusConflict
	})
	require.Equal(t, http.StatusCreated, retry.status)
	require.Equal(t, "true", retry.header.Get(idempotency.ReplayedHeader))
}

// TestLeaseExtendedWhileSlow: a request slower than its lease keeps it
// (extension), so a duplicate meanwhile gets 409, not a second execution.
func TestLeaseExtendedWhileSlow(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.lease = 400 * time.Millisecond })
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 1500 * time.Millisecond}))
	done := make(chan reply, 1)
	go func() { done <- h.checkout("slow-1", teeBody) }()
	eventually(t, "the slow request to reach Stripe", func() bool { return h.emu.InFlight() == 1 })
	for range 3 {
		time.Sleep(400 * time.Millisecond) // one lease at a time: the extension must keep it
		dup := h.checkout("slow-1", teeBody)
		require.Equal(t, http.StatusConflict, dup.status, "%s", dup.body)
		require.Equal(t, "idempotency_key_in_use", decodeProblem(t, dup).Code)
	}
	first := <-done
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	require.Equal(t, 1, h.emu.TotalCreated())
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
	require.Contains(t, h.scrape(), "checkout_idempotency_lease_extensions_total")
}

func (h *harness) scrape() string {
	h.t.Helper()
	resp, err := http.Get(h.srv.URL + "/metrics")
	require.NoError(h.t, err)
	defer resp.Body.Close()
	var b strings.Builder
	_, err = fmt.Fprint(&b, mustRead(h.t, resp))
	require.NoError(h.t, err)
	return b.String()
}

// TestTakeoverAfterExpiredLease: a key whose owner died (lease not
// released) answers 409 while the lease lives, then a retry takes it over and
// resumes at its recovery point.
func TestTakeoverAfterExpiredLease(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.NoError(t, h.emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultFail, Status: 500}))
	require.Equal(t, http.StatusBadGateway, h.checkout("dead-1", teeBody).status)
	h.emu.ClearFaults()
	// Pretend the process died holding the lease.
	require.NoError(t, h.db.Exec(`UPDATE idempotency_keys SET lease_owner = 'dead', lease_expires_at = now() + interval '1 hour'`).Error)
	r := h.checkout("dead-1", teeBody)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, "idempotency_key_in_use", decodeProblem(t, r).Code)

	require.NoError(t, h.db.Exec(`UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second'`).Error)
	r = h.checkout("dead-1", teeBody)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
	require.Equal(t, 1, h.emu.TotalCreated())
}

// TestKeyReusableAfterTTL: past IDEMPOTENCY_TTL a key is a new request,
// even while Redis still caches the old response.
func TestKeyReusableAfterTTL(t *testing.T) {
	t.Parallel()
	clk := &testenv.Clock{}
	h := setup(t, func(o *options) { o.ttl = time.Hour; o.now = clk.Now })
	first := h.checkout("ttl-1", teeBody)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "true", h.checkout("ttl-1", teeBody).header.Get(idempotency.ReplayedHeader))

	clk.Advance(time.Hour + time.Second)
	second := h.checkout("ttl-1", teeBody)
	require.Equal(t, http.StatusCreated, second.status, "%s", second.body)
	require.Empty(t, second.header.Get(idempotency.ReplayedHeader))
	require.NotEqual(t, decodeOrder(t, first).ID, decodeOrder(t, second).ID)
	require.Equal(t, 2, h.count(`SELECT count(*) FROM orders`))
	require.Equal(t, 2, h.emu.TotalCreated(), "a new order gets a new Stripe key")
}

// TestRedisDown: with Redis unreachable, closed mode answers 503, runs
// nothing and is not ready; open mode still executes once per key on
// Postgres alone and stays ready.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	t.Run("closed", func(t *testing.T) {
		t.Parallel()
		rs := testenv.StartRedis(t)
		h := setup(t, func(o *options) { o.redisURL = rs.URL() })
		require.Equal(t, http.StatusCreated, h.checkout("rd-1", teeBody).status)
		rs.Stop()
		r := h.checkout("rd-2", teeBody)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
		require.Equal(t, "unavailable", decodeProblem(t, r).Code)
		require.NotEmpty(t, r.header.Get("Retry-After"))
		require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
		ready := h.get("", "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, ready.status)
		require.Contains(t, string(ready.body), "redis")

		rs.Restart(t)
		require.Equal(t, http.StatusCreated, h.checkout("rd-2", teeBody).status)
		r = h.checkout("rd-1", teeBody) // the restarted Redis is empty: Postgres replays
		require.Equal(t, http.StatusCreated, r.status)
		require.Equal(t, "true", r.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, 2, h.emu.TotalCreated())
	})
	t.Run("open", func(t *testing.T) {
		t.Parallel()
		rs := testenv.StartRedis(t)
		h := setup(t, func(o *options) { o.redisURL = rs.URL(); o.failureMode = idempotency.FailOpen })
		rs.Stop()
		// Ready all the same: an open API serves on Postgres alone, so a
		// Redis outage must not take it out of the load balancer.
		ready := h.get("", "/readyz")
		require.Equal(t, http.StatusOK, ready.status, "%s", ready.body)
		var wg sync.WaitGroup
		replies := make([]reply, 20)
		for i := range replies {
			wg.Add(1)
			go func() { defer wg.Done(); replies[i] = h.checkout("open-1", teeBody) }()
		}
		wg.Wait()
		for _, r := range replies {
			require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, r.status, "%s", r.body)
		}
		r := h.checkout("open-1", teeBody)
		require.Equal(t, http.StatusCreated, r.status)
		require.Equal(t, "true", r.header.Get(idempotency.ReplayedHeader))
		require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
		require.Equal(t, 1, h.emu.TotalCreated())
	})
}

// TestRedisFlushed: with the Redis cache gone, Postgres replays the stored
// response byte for byte.
func TestRedisFlushed(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for _, body := range []string{teeBody, declinedBody, soldOutBody} {
		key := "flush-" + testenv.Random(4)
		first := h.checkout(key, body)
		h.flushRedis()
		again := h.checkout(key, body)
		require.Equal(t, first.status, again.status)
		require.Equal(t, string(first.body), string(again.body))
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
		require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	}
	require.Equal(t, 2, h.emu.TotalCreated())
}

// TestSmallPool: with two connections, 30 concurrent checkouts all finish:
// nothing queries the root handle while holding a transaction.
func TestSmallPool(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.maxConns = 2 })
	var wg sync.WaitGroup
	statuses := make([]int, 30)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = h.checkout(fmt.Sprintf("pool-%d", i), teeBody).status
		}()
	}
	wg.Wait()
	for _, s := range statuses {
		require.Equal(t, http.StatusCreated, s)
	}
	require.Equal(t, 30, h.count(`SELECT count(*) FROM orders WHERE status = 'paid'`))
}

// TestProducts lists the seeded catalog with live stock.
func TestProducts(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.checkout("products-1", teeBody).status)
	r := h.get("sk_test_acme", "/v1/products")
	require.Equal(t, http.StatusOK, r.status)
	var got struct {
		Data []checkout.Product `json:"data"`
	}
	require.NoError(t, json.Unmarshal(r.body, &got))
	require.Equal(t, []checkout.Product{
		{SKU: "sku_hoodie", Name: "Hoodie", UnitAmount: 5500, Currency: "usd", Stock: 10_000_000},
		{SKU: "sku_mug", Name: "Mug", UnitAmount: 1200, Currency: "usd", Stock: 10_000_000},
		{SKU: "sku_sold_out", Name: "Sold out", UnitAmount: 900, Currency: "usd", Stock: 0},
		{SKU: "sku_tee", Name: "T-shirt", UnitAmount: 2500, Currency: "usd", Stock: 10_000_000 - 2},
	}, got.Data)
	require.Equal(t, http.StatusUnauthorized, h.get("", "/v1/products").status)
}

// TestHeaderEdgeCases: headers a proxy could read differently are refused
// rather than guessed at; the draft's quoted key form is the same key.
func TestHeaderEdgeCases(t *testing.T) {
	t.Parallel()
	h := setup(t)
	post := func(header http.Header, body string) reply {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/checkouts", strings.NewReader(body))
		require.NoError(t, err)
		req.Header = header
		return h.send(req)
	}
	base := func(key string) http.Header {
		return http.Header{"Authorization": {"Bearer sk_test_acme"}, "Content-Type": {"application/json"}, "Idempotency-Key": {key}}
	}

	twoAuth := base("hdr-1")
	twoAuth["Authorization"] = []string{"Bearer sk_test_globex", "Bearer sk_test_acme"}
	require.Equal(t, http.StatusUnauthorized, post(twoAuth, teeBody).status, "two Authorization headers")

	twoTypes := base("hdr-2")
	twoTypes["Content-Type"] = []string{"application/json", "application/json"}
	require.Equal(t, http.StatusUnsupportedMediaType, post(twoTypes, teeBody).status, "two Content-Type headers")

	gzipped := base("hdr-3")
	gzipped.Set("Content-Encoding", "gzip")
	require.Equal(t, http.StatusUnsupportedMediaType, post(gzipped, teeBody).status, "a Content-Encoding")

	twoKeys := base("hdr-4")
	twoKeys["Idempotency-Key"] = []string{"a", "b"}
	r := post(twoKeys, teeBody)
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Contains(t, string(r.body), "exactly one Idempotency-Key")

	first := post(base(`"quoted-1"`), teeBody)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	plain := post(base("quoted-1"), teeBody)
	require.Equal(t, "true", plain.header.Get(idempotency.ReplayedHeader), "the sf-string form names the same key")
	require.Equal(t, string(first.body), string(plain.body))
	require.Equal(t, http.StatusBadRequest, post(base(`"unterminated`), teeBody).status)

	require.Equal(t, 0, h.count(`SELECT count(*) FROM orders WHERE tenant_id = 'globex'`))
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
}

// TestEquivalentNumbers: 2.0 and 2e0 are 2 in the canonical form, so they
// are the same request as 2 both for replay and for validation.
func TestEquivalentNumbers(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.checkout("num-1", strings.Replace(teeBody, `"quantity":2`, `"quantity":2.0`, 1))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, 2, decodeOrder(t, r).Items[0].Quantity)
	again := h.checkout("num-1", strings.Replace(teeBody, `"quantity":2`, `"quantity":2e0`, 1))
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	same := h.checkout("num-1", teeBody)
	require.Equal(t, string(r.body), string(same.body))
}

// TestOddOrderIDs: an id that cannot be an order is a 404, never a 5xx.
func TestOddOrderIDs(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for _, id := range []string{"%00", "ord_", "x", "ord_" + strings.Repeat("g", 32), strings.Repeat("a", 300)} {
		r := h.get("sk_test_acme", "/v1/orders/"+id)
		require.Equal(t, http.StatusNotFound, r.status, "%s: %s", id, r.body)
	}
}

// TestUnicodeEmail: an internationalized address (RFC 6531) is accepted.
func TestUnicodeEmail(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.checkout("uni-1", strings.Replace(teeBody, "buyer@example.com", "josé@exämple.com", 1))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, "josé@exämple.com", decodeOrder(t, r).Email)
}

// TestResponseShapeLimits: a body of thousands of unknown members gets a
// bounded answer, and a trailing slash is a 404 problem, not a redirect.
func TestResponseShapeLimits(t *testing.T) {
	t.Parallel()
	h := setup(t)
	var b strings.Builder
	b.WriteString(`{"email":"a@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_visa"`)
	for i := range 2000 {
		fmt.Fprintf(&b, `,"x%d":1`, i)
	}
	b.WriteString("}")
	r := h.checkout("limits-1", b.String())
	require.Equal(t, http.StatusBadRequest, r.status)
	p := decodeProblem(t, r)
	require.Len(t, p.Errors, 50)
	require.Less(t, len(r.body), 10_000)

	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/checkouts/", strings.NewReader(teeBody))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.Set("Idempotency-Key", "limits-2")
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
}

// TestOutOfStockLeavesNothing: when a later SKU of a basket is short, the
// units already reserved for an earlier one, the order, its items and its
// order.created event are all rolled back (to the savepoint before the
// order); only the key's stored 409 remains.
func TestOutOfStockLeavesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.NoError(t, h.db.Exec(`UPDATE products SET stock = 1 WHERE sku = 'sku_tee'`).Error)
	body := `{"email":"buyer@example.com","items":[{"sku":"sku_mug","quantity":1},{"sku":"sku_tee","quantity":2}],"payment_method":"pm_card_visa"}`
	r := h.checkout("short-1", body)
	require.Equal(t, http.StatusConflict, r.status, "%s", r.body)
	require.Equal(t, "out_of_stock", decodeProblem(t, r).Code)

	require.EqualValues(t, 10_000_000, h.stock("sku_mug"), "sku_mug was reserved first (sku order) and given back")
	require.EqualValues(t, 1, h.stock("sku_tee"))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM orders`))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM order_items`))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM outbox`))
	require.Equal(t, 0, h.emu.TotalCreated())
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished' AND response_status = 409 AND order_id IS NULL`))

	again := h.checkout("short-1", body)
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, string(r.body), string(again.body))
}

// TestCorruptCacheEntry: a replay-cache entry in Redis that does not decode
// is treated as absent: Postgres replays the stored response byte for byte
// (not 503 until the entry expires), and the cache is written again.
func TestCorruptCacheEntry(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.checkout("corrupt-1", teeBody)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	scope := idempotency.Scope{Tenant: "acme", Route: checkout.Route, Key: "corrupt-1"}
	respKey := h.prefix + "idem:{" + scope.Hash() + "}:resp"
	eventually(t, "the response to be cached", func() bool { return h.rdb.Exists(context.Background(), respKey).Val() == 1 })
	require.NoError(t, h.rdb.Set(context.Background(), respKey, "{garbage", time.Hour).Err())

	again := h.checkout("corrupt-1", teeBody)
	require.Equal(t, http.StatusCreated, again.status, "%s", again.body)
	require.Equal(t, "true", again.header.Get(idempotency.ReplayedHeader))
	require.Equal(t, string(first.body), string(again.body))
	eventually(t, "the response to be cached again", func() bool {
		b, err := h.rdb.Get(context.Background(), respKey).Bytes()
		return err == nil && !bytes.Equal(b, []byte("{garbage")) // the compact encoding, not JSON
	})
	require.Equal(t, 1, h.count(`SELECT count(*) FROM orders`))
	require.Equal(t, 1, h.emu.TotalCreated())
}
