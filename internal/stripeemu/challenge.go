package stripeemu

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
)

// challengePath is where the emulator serves the 3D Secure challenge page
// that next_action.redirect_to_url.url points to. Stripe's own page lives on
// hooks.stripe.com (https://docs.stripe.com/payments/3d-secure/authentication-flow);
// the emulator serves it itself, under the address the customer's browser
// reaches it at (WithPublicURL).
const challengePath = "/3d_secure_2/hosted"

// defaultPublicURL is the host of redirect_to_url.url without WithPublicURL:
// Stripe's, which no browser can complete against the emulator.
const defaultPublicURL = "https://hooks.stripe.com"

// WithPublicURL sets the base URL the customer's browser reaches the
// emulator at (e.g. "http://127.0.0.1:12111"): redirect_to_url.url points
// to its challenge page there. Without it the URL is on hooks.stripe.com,
// as Stripe's are, and only the control route
// /_emulator/payment_intents/{id}/authenticate completes the challenge.
func WithPublicURL(u string) Option {
	return func(e *Emulator) {
		if u != "" {
			e.publicURL = strings.TrimRight(u, "/")
		}
	}
}

// redirectURL is next_action.redirect_to_url.url for s.
func (e *Emulator) redirectURL(s *storedIntent) string {
	return e.publicURL + challengePath + "?payment_intent=" + url.QueryEscape(s.pi.ID) +
		"&payment_intent_client_secret=" + url.QueryEscape(s.pi.ClientSecret)
}

// challengeIntent returns the PaymentIntent a challenge request names, after
// checking its client secret as Stripe's hosted page does; mu is held.
func (e *Emulator) challengeIntentLocked(r *http.Request) (*storedIntent, error) {
	s, ok := e.intents[r.FormValue("payment_intent")]
	if !ok || subtle.ConstantTimeCompare([]byte(s.pi.ClientSecret), []byte(r.FormValue("payment_intent_client_secret"))) != 1 {
		return nil, ErrNotFound
	}
	return s, nil
}

// challengeView is what the challenge page shows.
type challengeView struct {
	ID, Secret, Status, Amount string
	Waiting                    bool
	ReturnURL                  string
}

var challengePage = template.Must(template.New("challenge").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>3D Secure test page</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font-family:system-ui,sans-serif;max-width:32rem;margin:3rem auto;padding:0 1rem}
.card{border:1px solid #ccc;border-radius:8px;padding:1.5rem}button{font-size:1rem;padding:.5rem 1rem;margin-right:.5rem}
.note{color:#666;font-size:.9rem}</style></head>
<body><div class="card">
<h1>3D Secure 2 test payment page</h1>
<p class="note">The Stripe emulator plays the bank's challenge here, as Stripe's test page does.</p>
<p>Payment <code id="pi">{{.ID}}</code> of <strong>{{.Amount}}</strong> is <code id="status">{{.Status}}</code>.</p>
{{if .Waiting}}
<form method="post">
<input type="hidden" name="payment_intent" value="{{.ID}}">
<input type="hidden" name="payment_intent_client_secret" value="{{.Secret}}">
<button id="approve" name="outcome" value="succeed">Complete authentication</button>
<button id="fail" name="outcome" value="fail">Fail authentication</button>
</form>
{{else if .ReturnURL}}
<p>Nothing to authenticate. <a id="return" href="{{.ReturnURL}}">Return to the merchant</a></p>
{{end}}
</div></body></html>
`))

// getChallenge serves GET /3d_secure_2/hosted?payment_intent=…&payment_intent_client_secret=…:
// the challenge page with "Complete" and "Fail" buttons while the
// PaymentIntent is requires_action; 404 for an unknown id or a wrong secret.
func (e *Emulator) getChallenge(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	s, err := e.challengeIntentLocked(r)
	var v challengeView
	if err == nil {
		v = challengeView{ID: s.pi.ID, Secret: s.pi.ClientSecret, Status: s.pi.Status,
			Amount:  fmt.Sprintf("%d.%02d %s", s.pi.Amount/100, s.pi.Amount%100, strings.ToUpper(s.pi.Currency)),
			Waiting: s.pi.Status == statusRequiresAction, ReturnURL: e.returnURLLocked(s, "")}
	}
	e.mu.Unlock()
	if err != nil {
		http.Error(w, "No such payment_intent, or a wrong client secret.", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_ = challengePage.Execute(w, v)
}

// postChallenge serves the challenge page's form: outcome=succeed or fail
// plays the challenge (Authenticate), then sends the browser back to the
// return_url of the confirmation with payment_intent,
// payment_intent_client_secret and redirect_status in the query, as Stripe
// does (https://docs.stripe.com/payments/3d-secure/authentication-flow#manual-redirect:
// "Stripe redirects the customer to the return_url ... with the
// payment_intent and payment_intent_client_secret URL query parameters").
// 404 for an unknown id or a wrong secret, 400 for another outcome, 409 when
// the PaymentIntent no longer waits for the customer.
func (e *Emulator) postChallenge(w http.ResponseWriter, r *http.Request) {
	outcome := r.FormValue("outcome")
	if outcome != "succeed" && outcome != "fail" {
		http.Error(w, "outcome: want succeed or fail", http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	s, err := e.challengeIntentLocked(r)
	var back string
	if err == nil {
		back = s.returnURL
		_, err = e.authenticateLocked(s, outcome == "succeed")
	}
	if err == nil {
		status := "succeeded"
		if outcome == "fail" {
			status = "failed"
		}
		back = e.returnURLLocked(s, status)
	}
	e.mu.Unlock()
	switch {
	case errors.Is(err, ErrNotFound):
		http.Error(w, "No such payment_intent, or a wrong client secret.", http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	e.logger.Info("stripe emulator: 3D Secure challenge played in the browser", "payment_intent", s.pi.ID, "outcome", outcome)
	if back == "" {
		// Confirmed without a return_url (use_stripe_sdk): Stripe.js would
		// close its modal; there is nowhere to go back to.
		http.Redirect(w, r, e.redirectURL(s), http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// returnURLLocked is s's return_url with payment_intent,
// payment_intent_client_secret and, when status is not "",
// redirect_status added to its query; "" when s was confirmed without one.
func (e *Emulator) returnURLLocked(s *storedIntent, status string) string {
	if s.returnURL == "" {
		return ""
	}
	u, err := url.Parse(s.returnURL)
	if err != nil {
		return ""
	}
	q := u.Query()
	q.Set("payment_intent", s.pi.ID)
	q.Set("payment_intent_client_secret", s.pi.ClientSecret)
	if status != "" {
		q.Set("redirect_status", status)
	}
	u.RawQuery = q.Encode()
	return u.String()
}
