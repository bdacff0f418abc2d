package payments_test

import (
	"bytes"
	"context"
	"encoding/json"
	"go/build"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/payments"
	"github.com/onceonly/checkout/internal/refunds"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripestep"
)

// The contract: the same client calls and raw requests, run against the
// emulator and against stripe-mock (Stripe's OpenAPI-validating mock). The
// emulator is trusted only because both pass. stripe-mock is stateless and
// answers with fixtures, so the contract checks shapes and status classes,
// not amounts or idempotent replays.

func TestContractEmulator(t *testing.T) {
	t.Parallel()
	emu := stripeemu.New()
	srv := httptest.NewServer(emu)
	t.Cleanup(emu.Close)
	t.Cleanup(srv.Close)
	runContract(t, srv.URL)
}

func TestContractStripeMock(t *testing.T) {
	t.Parallel()
	runContract(t, startStripeMock(t))
}

func runContract(t *testing.T, base string) {
	t.Helper()
	client := payments.NewClient(payments.Config{APIBase: base, SecretKey: "sk_test_123",
		Timeout: 5 * time.Second, MaxElapsed: 5 * time.Second}, nil, nil)

	t.Run("create and confirm accepted", func(t *testing.T) {
		t.Parallel()
		req := createReq(t, "pm_card_visa")
		pi, err := client.CreatePaymentIntent(t.Context(), req)
		require.NoError(t, err, "the create request shape must be accepted")
		require.Regexp(t, `^pi_`, pi.ID)
		require.NotEmpty(t, pi.Status)

		again, err := client.CreatePaymentIntent(t.Context(), req)
		require.NoError(t, err, "the same call with the same key is accepted again")
		require.Regexp(t, `^pi_`, again.ID)

		got, err := client.ConfirmPaymentIntent(t.Context(), checkout.ConfirmIntentRequest{
			IdempotencyKey: stripestep.Key("ord_"+t.Name(), checkout.StepConfirm, 1), PaymentIntentID: pi.ID})
		require.NoError(t, err, "the confirm request shape must be accepted")
		require.Regexp(t, `^pi_`, got.ID)

		read, err := client.RetrievePaymentIntent(t.Context(), pi.ID)
		require.NoError(t, err, "the retrieve request shape must be accepted")
		require.Regexp(t, `^pi_`, read.ID)

		orphan, err := client.CreatePaymentIntent(t.Context(), checkout.CreateIntentRequest{
			IdempotencyKey: stripestep.Key("ord_"+t.Name(), checkout.StepCreate, 2), Amount: 2500, Currency: "usd",
			PaymentMethod: "pm_card_visa", OrderID: "ord_1", TenantID: "acme"})
		require.NoError(t, err)
		canceled, err := client.CancelPaymentIntent(t.Context(), checkout.CancelIntentRequest{
			IdempotencyKey:  stripestep.Key("ord_"+t.Name(), checkout.StepCancel, 1),
			PaymentIntentID: orphan.ID, Reason: checkout.CancelDuplicate})
		require.NoError(t, err, "the cancel request shape must be accepted")
		require.Regexp(t, `^pi_`, canceled.ID)

		_, err = client.SearchPaymentIntents(t.Context(), "ord_1")
		require.NoError(t, err, "the search request shape must be accepted")

		r := rawRequest(t, base, http.MethodGet, "/v1/payment_intents/"+pi.ID, "sk_test_123", "")
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		require.Equal(t, "payment_intent", r.object())
	})

	t.Run("refund calls accepted", func(t *testing.T) {
		t.Parallel()
		pi, err := client.CreatePaymentIntent(t.Context(), createReq(t, "pm_card_visa"))
		require.NoError(t, err)
		_, err = client.ConfirmPaymentIntent(t.Context(), checkout.ConfirmIntentRequest{
			IdempotencyKey: stripestep.Key("ord_"+t.Name(), checkout.StepConfirm, 1), PaymentIntentID: pi.ID})
		require.NoError(t, err)

		p := refunds.CreateParams{IdempotencyKey: "ord_1/refund:rf_" + t.Name() + "/1", PaymentIntentID: pi.ID, Amount: 1000,
			Reason: "requested_by_customer", RefundID: "rf_1", OrderID: "ord_1", TenantID: "acme"}
		rf, err := client.CreateRefund(t.Context(), p)
		require.NoError(t, err, "the refund create shape must be accepted")
		require.Regexp(t, `^re_`, rf.ID)
		again, err := client.CreateRefund(t.Context(), p)
		require.NoError(t, err, "the same refund with the same key is accepted again")
		require.Regexp(t, `^re_`, again.ID)
		got, err := client.GetRefund(t.Context(), rf.ID)
		require.NoError(t, err, "the refund retrieve shape must be accepted")
		require.Regexp(t, `^re_`, got.ID)
		list, err := client.ListRefunds(t.Context(), pi.ID)
		require.NoError(t, err, "the refund list shape must be accepted")
		require.NotEmpty(t, list)
		recent, err := client.ListRefundsSince(t.Context(), time.Now().Add(-time.Hour))
		require.NoError(t, err, "the list of the account's recent refunds (created[gte]) must be accepted")
		require.NotEmpty(t, recent)
		_, _, err = client.IntentOrder(t.Context(), pi.ID)
		require.NoError(t, err, "reading a PaymentIntent's order must be accepted")
	})

	t.Run("payment intent lifecycle with stripe-go", func(t *testing.T) {
		t.Parallel()
		sc := stripeGo(base)
		create := &stripe.PaymentIntentParams{Amount: stripe.Int64(2500), Currency: stripe.String("usd"),
			PaymentMethod: stripe.String("pm_card_visa"), PaymentMethodTypes: stripe.StringSlice([]string{"card"}),
			Confirm: stripe.Bool(false)}
		create.AddMetadata("order_id", "ord_contract")
		create.AddMetadata("tenant_id", "acme")
		create.SetIdempotencyKey("contract-create-" + t.Name())
		pi, err := sc.PaymentIntents.New(create)
		require.NoError(t, err, "create without confirm")
		require.Regexp(t, `^pi_`, pi.ID)

		confirm := &stripe.PaymentIntentConfirmParams{}
		confirm.SetIdempotencyKey("contract-confirm-" + t.Name())
		confirmed, err := sc.PaymentIntents.Confirm(pi.ID, confirm)
		require.NoError(t, err, "confirm")
		require.Regexp(t, `^pi_`, confirmed.ID)

		got, err := sc.PaymentIntents.Get(pi.ID, &stripe.PaymentIntentParams{Expand: stripe.StringSlice([]string{"latest_charge"})})
		require.NoError(t, err, "retrieve with latest_charge expanded")
		require.Regexp(t, `^pi_`, got.ID)

		refund := &stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(1000),
			Reason: stripe.String("requested_by_customer")}
		refund.AddMetadata("order_id", "ord_contract")
		refund.SetIdempotencyKey("contract-refund-" + t.Name())
		rf, err := sc.Refunds.New(refund)
		require.NoError(t, err, "partial refund of the PaymentIntent")
		require.Regexp(t, `^re_`, rf.ID)
		gotRefund, err := sc.Refunds.Get(rf.ID, nil)
		require.NoError(t, err, "retrieve the refund")
		require.Regexp(t, `^re_`, gotRefund.ID)
		refunds := &stripe.RefundListParams{PaymentIntent: stripe.String(pi.ID)}
		refunds.Single = true
		rit := sc.Refunds.List(refunds)
		for rit.Next() {
			require.Regexp(t, `^re_`, rit.Refund().ID)
		}
		require.NoError(t, rit.Err(), "list the PaymentIntent's refunds")

		threeDS := &stripe.PaymentIntentParams{Amount: stripe.Int64(4200), Currency: stripe.String("eur"),
			PaymentMethod: stripe.String("pm_card_authenticationRequired"), Confirm: stripe.Bool(true),
			ReturnURL: stripe.String("https://shop.example/return")}
		threeDS.AddMetadata("order_id", "ord_contract_3ds")
		action, err := sc.PaymentIntents.New(threeDS)
		require.NoError(t, err, "create and confirm with 3D Secure and a return_url")
		require.Regexp(t, `^pi_`, action.ID)

		toCancel, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd"),
			PaymentMethod: stripe.String("pm_card_visa")})
		require.NoError(t, err)
		cancel := &stripe.PaymentIntentCancelParams{CancellationReason: stripe.String("duplicate")}
		cancel.SetIdempotencyKey("contract-cancel-" + t.Name())
		canceled, err := sc.PaymentIntents.Cancel(toCancel.ID, cancel)
		require.NoError(t, err, "cancel")
		require.Regexp(t, `^pi_`, canceled.ID)

		list := &stripe.PaymentIntentListParams{}
		list.Limit = stripe.Int64(3)
		list.Single = true
		it := sc.PaymentIntents.List(list)
		n := 0
		for it.Next() {
			require.Regexp(t, `^pi_`, it.PaymentIntent().ID)
			n++
		}
		require.NoError(t, it.Err(), "list")
		require.NotZero(t, n)

		search := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{
			Query: "metadata['order_id']:'ord_contract'", Limit: stripe.Int64(10), Single: true}}
		sit := sc.PaymentIntents.Search(search)
		for sit.Next() {
			require.Regexp(t, `^pi_`, sit.PaymentIntent().ID)
		}
		require.NoError(t, sit.Err(), "search by metadata")
	})

	t.Run("unknown parameter rejected", func(t *testing.T) {
		t.Parallel()
		r := rawRequest(t, base, http.MethodPost, "/v1/payment_intents", "sk_test_123",
			"amount=2500&currency=usd&colour=red")
		require.Equal(t, http.StatusBadRequest, r.status, string(r.body))
		require.Equal(t, "invalid_request_error", r.errorType())
	})

	t.Run("non integer amount rejected", func(t *testing.T) {
		t.Parallel()
		r := rawRequest(t, base, http.MethodPost, "/v1/payment_intents", "sk_test_123", "amount=abc&currency=usd")
		require.Equal(t, http.StatusBadRequest, r.status, string(r.body))
		require.Equal(t, "invalid_request_error", r.errorType())
	})

	t.Run("missing api key unauthorized", func(t *testing.T) {
		t.Parallel()
		r := rawRequest(t, base, http.MethodPost, "/v1/payment_intents", "", "amount=2500&currency=usd")
		require.Equal(t, http.StatusUnauthorized, r.status, string(r.body))
		require.Equal(t, "invalid_request_error", r.errorType())
	})
}

// stripeGo is a stripe-go v76 client of base, without retries.
func stripeGo(base string) *client.API {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(base),
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	api := &client.API{}
	api.Init("sk_test_123", &stripe.Backends{API: backend, Connect: backend, Uploads: backend})
	return api
}

// rawReply is a raw HTTP response.
type rawReply struct {
	status int
	body   []byte
}

func (r rawReply) errorType() string {
	var v struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &v)
	return v.Error.Type
}

func (r rawReply) object() string {
	var v struct {
		Object string `json:"object"`
	}
	_ = json.Unmarshal(r.body, &v)
	return v.Object
}

func rawRequest(t testing.TB, base, method, path, apiKey, form string) rawReply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(form))
	require.NoError(t, err)
	if form != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return rawReply{status: res.StatusCode, body: body}
}

// stripeMockBin finds stripe-mock: $STRIPE_MOCK_BIN, then PATH, then
// $(go env GOPATH)/bin.
func stripeMockBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("STRIPE_MOCK_BIN"); p != "" {
		return p
	}
	if p, err := exec.LookPath("stripe-mock"); err == nil {
		return p
	}
	for _, dir := range filepath.SplitList(build.Default.GOPATH) {
		p := filepath.Join(dir, "bin", "stripe-mock")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("stripe-mock not found in $STRIPE_MOCK_BIN, PATH or $(go env GOPATH)/bin; `make tools` installs it " +
		"(go install github.com/stripe/stripe-mock@v0.203.0)")
	return ""
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var listeningRE = regexp.MustCompile(`Listening for HTTP at address: (\S+)`)

// startStripeMock runs stripe-mock on free ports (it picks them; HTTPS too,
// so parallel runs never collide on its default 12112), waits until it
// answers and kills it when the test ends. It returns its base URL.
func startStripeMock(t testing.TB) string {
	t.Helper()
	out := &lockedBuffer{}
	cmd := exec.Command(stripeMockBin(t), "-http-addr", "127.0.0.1:", "-https-addr", "127.0.0.1:")
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start(), "start stripe-mock")
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	var base string
	require.Eventually(t, func() bool {
		if m := listeningRE.FindStringSubmatch(out.String()); m != nil {
			base = "http://" + m[1]
			return true
		}
		return false
	}, 60*time.Second, 20*time.Millisecond, "stripe-mock did not start; output:\n%s", out)

	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/payment_intents/pi_123", nil)
		req.Header.Set("Authorization", "Bearer sk_test_123")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "stripe-mock did not answer; output:\n%s", out)
	return base
}
