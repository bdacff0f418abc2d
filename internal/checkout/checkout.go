// Package checkout runs a checkout through its phases (the order
// lifecycle they move along is orders.Status): catalog, stock and the
// phases that turn one idempotent POST /v1/checkouts into exactly one
// order and at most one PaymentIntent that moves money, however often it is
// retried or interrupted, whatever Stripe answers.
//
// The phases, each ending at a recovery point stored with the idempotency
// key (see DESIGN.md):
//
//  1. Transaction 1: claim the key, validate, reserve stock, insert the order
//     (pending_payment), its items and order.created in the outbox; recovery
//     point order_created. Out of stock finishes the key with a stored 409.
//  2. The payment saga (saga.go, confirm.go, and cancelintent.go for the
//     cancel step): steps persisted in payment_attempts before each Stripe
//     call, each with a key derived from (order, step, attempt): create the
//     PaymentIntent unconfirmed, record its id, confirm it.
//     Every indeterminate answer is reconciled with Stripe (GET by id after a
//     confirm, search by metadata after a create) before any new attempt.
//  3. Settlement (settle.go, one transaction, after closeBeforeExit has
//     closed the money of any exit): the order becomes paid, requires_action
//     (3D Secure), or payment_failed with its stock released; its event goes
//     to the outbox; the key is finished with the response, which is then
//     replayed to every retry.
//
// A new key's checkout whose payment goes through is a first execution
// (fastpath.go): the same phases, each written as one statement, three
// commits in all. Everything else takes the general path, which reads the
// persisted state and carries on from it.
//
// Cancel (cancel.go) and the reconciliation of orders with what Stripe
// says (reconcile.go) are commands of their own. The API request, the
// worker's completer (expired leases) and its reconciler (orders waiting
// for Stripe or the customer) all run the same saga, and every change of
// an order's status goes through orders.QueueApply, the conditional update
// of the transitions table, which only moves forward.
package checkout

import (
	"fmt"
	"net/mail"
	"net/url"
	"strings"

	"golang.org/x/net/idna"

	"github.com/onceonly/checkout/internal/problem"
)

// Recovery points stored with a key between its transactions.
const (
	// RecoveryPointOrderCreated: transaction 1 of a checkout has committed;
	// the order exists and its payment saga is next.
	RecoveryPointOrderCreated = "order_created"
	// RecoveryPointCancelRequested: a POST /v1/orders/{id}/cancel has been
	// accepted for a requires_action order; canceling its PaymentIntent is
	// next.
	RecoveryPointCancelRequested = "cancel_requested"
)

// Routes are the idempotency scopes' route templates.
const (
	// Route is POST /v1/checkouts.
	Route = "POST /v1/checkouts"
	// CancelRoute is POST /v1/orders/{id}/cancel.
	CancelRoute = "POST /v1/orders/{id}/cancel"
)

// Limits of a checkout request (CONTRACT.md).
const (
	MaxItems    = 50
	MaxQuantity = 100
)

// Product is a catalog entry. Amounts are in the currency's minor unit.
type Product struct {
	SKU        string `json:"sku" gorm:"primaryKey;column:sku"`
	Name       string `json:"name"`
	UnitAmount int64  `json:"unit_amount"`
	Currency   string `json:"currency"`
	Stock      int64  `json:"stock"`
}

// TableName maps Product to the products table.
func (Product) TableName() string { return "products" }

// Request is the body of POST /v1/checkouts.
type Request struct {
	Email         string        `json:"email"`
	Items         []RequestItem `json:"items"`
	PaymentMethod string        `json:"payment_method"`
	// ReturnURL (optional) is passed to Stripe's confirm: a card that needs
	// 3D Secure then answers with next_action redirect_to_url, and Stripe
	// sends the customer back to it (CONTRACT.md, (v3) Clients).
	ReturnURL string `json:"return_url,omitempty"`
}

// RequestItem is one requested line.
type RequestItem struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// FieldError names one invalid field, e.g. {"field":"items[0].quantity",...}.
type FieldError = problem.FieldError

// validate checks what needs no database: the email, the item count and
// quantities, the payment method and the form of each sku. decoded are the
// errors decoding found (wrong types, unknown members); their fields are
// not checked again, and they are returned with the rest. SKUs are checked
// against the catalog in transaction 1.
func (r *Request) validate(decoded []FieldError) []FieldError {
	errs := append([]FieldError(nil), decoded...)
	bad := map[string]bool{}
	for _, e := range decoded {
		bad[e.Field] = true
	}
	if bad[""] {
		return errs // not an object: its members mean nothing
	}
	check := func(field, msg string) {
		if msg != "" && !bad[field] {
			errs = append(errs, FieldError{Field: field, Message: msg})
		}
	}
	check("email", checkEmail(r.Email))
	switch {
	case bad["items"]:
	case len(r.Items) == 0:
		check("items", "must contain at least 1 item")
	case len(r.Items) > MaxItems:
		check("items", fmt.Sprintf("must contain at most %d items", MaxItems))
	}
	for i, it := range r.Items {
		if bad[fmt.Sprintf("items[%d]", i)] {
			continue
		}
		check(fmt.Sprintf("items[%d].sku", i), checkToken(it.SKU, 64))
		if it.Quantity < 1 || it.Quantity > MaxQuantity {
			check(fmt.Sprintf("items[%d].quantity", i), fmt.Sprintf("must be an integer between 1 and %d", MaxQuantity))
		}
	}
	check("payment_method", checkToken(r.PaymentMethod, 255))
	check("return_url", checkReturnURL(r.ReturnURL))
	return errs
}

// MaxReturnURL is the longest return_url accepted: Stripe's limit for
// return_url ("Max length: 5000", docs.stripe.com/api/payment_intents/confirm).
const MaxReturnURL = 5000

// checkReturnURL checks an optional return_url: absent, or an absolute http
// or https URL with a host, which Stripe can redirect a browser to.
func checkReturnURL(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > MaxReturnURL {
		return fmt.Sprintf("must be at most %d characters", MaxReturnURL)
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		strings.ContainsFunc(s, func(r rune) bool { return r <= 0x20 || r == 0x7f }) {
		return "must be an absolute http or https URL, like https://shop.example/orders/return"
	}
	return ""
}

// checkToken checks an identifier such as a sku or a PaymentMethod id:
// present, at most max bytes, printable ASCII only (a NUL byte or a control
// character is a client error, not something to send to the database).
func checkToken(s string, max int) string {
	switch {
	case strings.TrimSpace(s) == "":
		return "is required"
	case len(s) > max:
		return fmt.Sprintf("must be at most %d characters", max)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return "must be printable ASCII without spaces"
		}
	}
	return ""
}

func checkEmail(s string) string {
	if s == "" {
		return "is required"
	}
	if len(s) > 254 {
		return "must be at most 254 characters"
	}
	if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "must not contain control characters"
	}
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name != "" || a.Address != s {
		return "must be an email address like buyer@example.com"
	}
	_, domain, _ := strings.Cut(a.Address, "@")
	if !deliverableDomain(domain) {
		return "must be an email address with a domain name that mail can be delivered to, like buyer@example.com"
	}
	return ""
}

// deliverableDomain reports whether domain is a host name mail can be sent
// to: it converts to IDNA ASCII under the registration rules (RFC 5891; no
// joiners, no mixed scripts), every label is a letter-digit-hyphen label
// (RFC 1035) that neither starts nor ends with a hyphen, and the top-level
// label has at least two letters. IP literals and single-label names are
// refused: a buyer is charged for an order whose email must arrive.
func deliverableDomain(domain string) bool {
	ascii, err := idna.Registration.ToASCII(domain)
	if err != nil || len(ascii) > 253 {
		return false
	}
	labels := strings.Split(ascii, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	tld := labels[len(labels)-1]
	if strings.HasPrefix(tld, "xn--") {
		return true
	}
	for i := 0; i < len(tld); i++ {
		if tld[i] < 'a' || tld[i] > 'z' {
			return false
		}
	}
	return len(tld) >= 2
}
