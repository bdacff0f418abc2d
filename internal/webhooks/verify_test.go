package webhooks

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76/webhook"
)

const testSecret = "whsec_test_checkout"

// sign returns a Stripe-Signature header for payload at t, as Stripe
// computes it (https://docs.stripe.com/webhooks#verify-manually).
func sign(payload []byte, secret string, t time.Time) string {
	return fmt.Sprintf("t=%d,v1=%s", t.Unix(), hex.EncodeToString(webhook.ComputeSignature(t, payload, secret)))
}

func TestVerify(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_1","object":"event","type":"payment_intent.succeeded","api_version":"2023-10-16","data":{"object":{"id":"pi_1","object":"payment_intent"}}}`)
	var generic any
	require.NoError(t, json.Unmarshal(body, &generic))
	reencoded, err := json.MarshalIndent(generic, "", "  ") // what a framework's binding then re-encoding gives
	require.NoError(t, err)
	now := time.Now()
	good := sign(body, testSecret, now)

	for _, tc := range []struct {
		name    string
		body    []byte
		header  string
		wantErr bool
	}{
		{"exact bytes verify", body, good, false},
		{"a rolled secret: one of two v1 signatures matches", body, sign(body, "whsec_old", now) + ",v1=" + strings.Split(good, "v1=")[1], false},
		{"an older API version's body that stripe-go cannot decode still verifies",
			[]byte(`{"id":"evt_2","type":"payment_intent.succeeded","api_version":"2015-01-01","request":"req_1","data":{"object":{"id":"pi_1"}}}`),
			sign([]byte(`{"id":"evt_2","type":"payment_intent.succeeded","api_version":"2015-01-01","request":"req_1","data":{"object":{"id":"pi_1"}}}`), testSecret, now), false},
		{"the same JSON re-encoded", reencoded, good, true},
		{"no header", body, "", true},
		{"malformed header", body, "garbage", true},
		{"no v1 signature", body, strings.Replace(good, "v1=", "v0=", 1), true},
		{"another secret", body, sign(body, "whsec_other", now), true},
		{"timestamp older than 300s", body, sign(body, testSecret, now.Add(-301*time.Second)), true},
		{"timestamp replaced", body, strings.Replace(good, "t="+strconv.FormatInt(now.Unix(), 10), "t="+strconv.FormatInt(now.Unix()+1, 10), 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Verifier{Secret: testSecret}.Verify(tc.body, tc.header)
			if tc.wantErr {
				require.ErrorIs(t, err, ErrInvalidSignature)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

// FuzzVerify checks that Verify never accepts a body the secret did not
// sign: a signature made for one body never verifies another, and any header
// that is accepted carries the HMAC of exactly this body under the secret.
// Seeds are in testdata/fuzz/FuzzVerify; run with
// go test -run '^$' -fuzz FuzzVerify ./internal/webhooks.
func FuzzVerify(f *testing.F) {
	f.Add([]byte(`{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{}}}`), []byte(`{"id": "evt_1","type":"payment_intent.succeeded","data":{"object":{}}}`), "t=1,v1=00", int64(0))
	f.Add([]byte(`{}`), []byte(`{} `), "", int64(299))
	f.Fuzz(func(t *testing.T, body, other []byte, header string, age int64) {
		v := Verifier{Secret: testSecret}
		if age < 0 {
			age = -age
		}
		at := time.Now().Add(-time.Duration(age%290) * time.Second)
		signed := sign(body, testSecret, at)
		if err := v.Verify(body, signed); err != nil {
			t.Fatalf("a body signed %ds ago does not verify: %v", age%290, err)
		}
		if !bytes.Equal(body, other) {
			if v.Verify(other, signed) == nil {
				t.Fatalf("the signature of %q verifies %q", body, other)
			}
		}
		if v.Verify(body, sign(body, "whsec_not_ours", at)) == nil {
			t.Fatalf("a signature made with another secret verifies")
		}
		// An arbitrary header is accepted only if it holds the HMAC of this
		// body for one of its timestamps.
		if v.Verify(body, header) == nil && !holdsSignature(header, body) {
			t.Fatalf("header %q accepted for %q without its signature", header, body)
		}
	})
}

// holdsSignature reports whether header has a t=… and a v1=… pair such that
// the v1 value is the HMAC of body at t under testSecret.
func holdsSignature(header string, body []byte) bool {
	var ts []int64
	var sigs []string
	for _, pair := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(pair, "=")
		switch k {
		case "t":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				ts = append(ts, n)
			}
		case "v1":
			sigs = append(sigs, strings.ToLower(v))
		}
	}
	for _, t := range ts {
		want := hex.EncodeToString(webhook.ComputeSignature(time.Unix(t, 0), body, testSecret))
		for _, s := range sigs {
			if s == want {
				return true
			}
		}
	}
	return false
}

func TestDecodeToleratesOtherAPIVersions(t *testing.T) {
	t.Parallel()
	// An event rendered in an old API version: request is a string, the
	// object has fields this code has never heard of, and a metadata value
	// is not a string.
	body := []byte(`{"id":"evt_old","type":"payment_intent.payment_failed","api_version":"2017-01-27","request":"req_x",
	 "data":{"object":{"id":"pi_9","object":"payment_intent","status":"requires_payment_method","amount":2500,"currency":"usd",
	  "future_field":{"nested":[1,2,3]},"metadata":{"order_id":"ord_1","tenant_id":"acme","count":3},
	  "last_payment_error":{"code":"card_declined","decline_code":"generic_decline","extra":true}}}}`)
	ev, err := DecodeEvent(body)
	require.NoError(t, err)
	require.Equal(t, "evt_old", ev.ID)
	pi, err := DecodePaymentIntent(ev.Data.Object)
	require.NoError(t, err)
	require.Equal(t, PaymentIntent{ID: "pi_9", Status: "requires_payment_method", Amount: 2500, Currency: "usd",
		OrderID: "ord_1", TenantID: "acme", LastErrorCode: "card_declined", LastDeclineCode: "generic_decline"}, pi)
	require.False(t, pi.Status.Final())

	_, err = DecodeEvent([]byte(`{"id":"evt"}`))
	require.True(t, errors.Is(err, ErrMalformedEvent))
	_, err = DecodePaymentIntent([]byte(`{"id":"ch_1","object":"charge"}`))
	require.ErrorIs(t, err, ErrMalformedEvent)
}
