package stripeemu_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v76"

	"github.com/onceonly/checkout/internal/stripeemu"
)

// TestChallengePage: a confirmation with a return_url answers
// next_action.redirect_to_url pointing to the emulator's own challenge page
// at its public URL; the page completes or fails the authentication and
// sends the browser back to the return_url with payment_intent,
// payment_intent_client_secret and redirect_status, as Stripe does. A wrong
// client secret shows nothing and plays nothing; a PaymentIntent no longer
// waiting cannot be played again.
func TestChallengePage(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(nil)
	public := "http://" + srv.Listener.Addr().String()
	emu := stripeemu.New(stripeemu.WithPublicURL(public))
	srv.Config.Handler = emu
	srv.Start()
	t.Cleanup(emu.Close)
	t.Cleanup(srv.Close)
	sc := stripeClient(t, bundle{emu: emu, url: srv.URL}, apiKey)
	browser := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	for _, tc := range []struct {
		outcome, wantRedirect string
		wantPI                stripe.PaymentIntentStatus
	}{
		{"succeed", "succeeded", stripe.PaymentIntentStatusSucceeded},
		{"fail", "failed", stripe.PaymentIntentStatusRequiresPaymentMethod},
	} {
		t.Run(tc.outcome, func(t *testing.T) {
			pi, err := sc.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(2500), Currency: stripe.String("usd"),
				PaymentMethod: stripe.String("pm_card_authenticationRequired"), Confirm: stripe.Bool(true),
				ReturnURL: stripe.String("http://shop.example/return?order=ord_1")})
			require.NoError(t, err)
			require.Equal(t, stripe.PaymentIntentNextActionType("redirect_to_url"), pi.NextAction.Type)
			page := pi.NextAction.RedirectToURL.URL
			require.True(t, strings.HasPrefix(page, public+"/3d_secure_2/hosted?"), page)

			res, err := browser.Get(page)
			require.NoError(t, err)
			html, _ := io.ReadAll(res.Body)
			res.Body.Close()
			require.Equal(t, http.StatusOK, res.StatusCode)
			require.Contains(t, string(html), `id="approve"`)
			require.Contains(t, string(html), `id="fail"`)

			wrong, err := browser.Get(public + "/3d_secure_2/hosted?payment_intent=" + pi.ID + "&payment_intent_client_secret=nope")
			require.NoError(t, err)
			wrong.Body.Close()
			require.Equal(t, http.StatusNotFound, wrong.StatusCode, "the client secret guards the page")
			res, err = browser.PostForm(public+"/3d_secure_2/hosted", url.Values{"payment_intent": {pi.ID},
				"payment_intent_client_secret": {"nope"}, "outcome": {tc.outcome}})
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, http.StatusNotFound, res.StatusCode)
			got, err := sc.PaymentIntents.Get(pi.ID, nil)
			require.NoError(t, err)
			require.Equal(t, stripe.PaymentIntentStatusRequiresAction, got.Status, "a wrong secret plays nothing")

			form := url.Values{"payment_intent": {pi.ID}, "payment_intent_client_secret": {pi.ClientSecret}, "outcome": {tc.outcome}}
			res, err = browser.PostForm(public+"/3d_secure_2/hosted", form)
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, http.StatusSeeOther, res.StatusCode)
			back, err := url.Parse(res.Header.Get("Location"))
			require.NoError(t, err)
			require.Equal(t, "shop.example", back.Host)
			require.Equal(t, "/return", back.Path)
			require.Equal(t, "ord_1", back.Query().Get("order"), "the return_url's own query is kept")
			require.Equal(t, pi.ID, back.Query().Get("payment_intent"))
			require.Equal(t, pi.ClientSecret, back.Query().Get("payment_intent_client_secret"))
			require.Equal(t, tc.wantRedirect, back.Query().Get("redirect_status"))

			got, err = sc.PaymentIntents.Get(pi.ID, nil)
			require.NoError(t, err)
			require.Equal(t, tc.wantPI, got.Status)

			res, err = browser.PostForm(public+"/3d_secure_2/hosted", form)
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, http.StatusConflict, res.StatusCode, "played once")
		})
	}
}
