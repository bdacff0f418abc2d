package storefront

import (
	"crypto/rand"
	"encoding/hex"
	"slices"

	"github.com/onceonly/checkout/client"
)

// Outcome is what one answer means for a purchase, as the page acts on it.
type Outcome string

// The outcomes of a Pay. OutcomePaid, OutcomeRequiresAction and
// OutcomeFailed are final: the purchase is over, and a new one gets a new
// key. OutcomeInvalid and OutcomeUnknown keep the purchase open under its
// key.
const (
	// OutcomePaid: the order is paid.
	OutcomePaid Outcome = "paid"
	// OutcomeRequiresAction: the order waits for 3D Secure; its page
	// follows it.
	OutcomeRequiresAction Outcome = "requires_action"
	// OutcomeFailed: the payment failed (or the API refused the purchase
	// for good); nothing was charged.
	OutcomeFailed Outcome = "failed"
	// OutcomeInvalid: nothing was done under the key; fix the form and
	// Pay again, same key.
	OutcomeInvalid Outcome = "invalid"
	// OutcomeUnknown: no final answer yet; Pay again is safe, same key.
	OutcomeUnknown Outcome = "unknown"
)

// PurchaseStatus is where a shopper's purchase is in its life, as the
// storefront keeps it for the session (CONTRACT.md, (v4) Clients: one open
// purchase per shopper, kept by the server with its key until its final
// answer).
type PurchaseStatus string

// The statuses of a purchase, in the order it goes through them.
const (
	// PurchaseOpen: the key is made, nothing was sent under it; the form's
	// details can still change.
	PurchaseOpen PurchaseStatus = "open"
	// PurchaseSent: its request (cart snapshot, email, card) was fixed at
	// its first Pay; no final answer yet. Every Pay sends that request.
	PurchaseSent PurchaseStatus = "sent"
	// PurchaseDone: a final answer came (Result).
	PurchaseDone PurchaseStatus = "done"
)

// Purchase is a shopper's purchase as the server keeps it and the
// checkout page shows it (its JSON is the page's state).
type Purchase struct {
	// Key is the purchase's key: made by the storefront when the checkout
	// is first shown, or the browser's own after a restart of the
	// storefront (adopted at its Pay). The API sees it scoped (APIKey).
	Key string `json:"key"`
	// Status is where the purchase is.
	Status PurchaseStatus `json:"status"`
	// Request is what every Pay sends, fixed at the first one; nil while
	// the purchase is PurchaseOpen.
	Request *payRequest `json:"request"`
	// APIKey is the Idempotency-Key sent to the API, "" before the first
	// Pay.
	APIKey string `json:"api_key"`
	// Pays counts the Pays received; InFlight those whose call to the API
	// has not finished (whether or not their browser still waits).
	Pays     int `json:"pays"`
	InFlight int `json:"in_flight"`
	// Attempts are every request sent to the API for the purchase.
	Attempts []Attempt `json:"attempts"`
	// Result is the final answer, once PurchaseDone.
	Result *PayResult `json:"result,omitempty"`
}

// newPurchase returns an open purchase under a key of its own.
func newPurchase() *Purchase {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &Purchase{Key: hex.EncodeToString(b[:]), Status: PurchaseOpen}
}

// view returns a copy of p that the caller may read without the lock.
func (p *Purchase) view() *Purchase {
	if p == nil {
		return nil
	}
	v := *p
	v.Attempts = slices.Clone(p.Attempts)
	if p.Request != nil {
		r := *p.Request
		r.Items = slices.Clone(p.Request.Items)
		v.Request = &r
	}
	return &v
}

// checkoutView is what the checkout page starts from: the session's open
// purchase, and the one before it once it is done.
type checkoutView struct {
	Open *Purchase `json:"open"`
	Last *Purchase `json:"last,omitempty"`
}

// current returns the session's open purchase, making one when there is
// none: a reload, a second tab, the Back button and a tab opened again
// after one closed all find the same one until it is done.
func (s *session) current() *Purchase {
	if s.open == nil {
		s.open = newPurchase()
	}
	return s.open
}

// payment is the purchase a Pay of the browser's in is about, and the
// request to send for it; nil when another purchase of the session was
// sent and is not done (the page is stale: it shows the other one after a
// reload). A Pay of the session's last purchase is answered with its
// Result (done). A key the session does not know (the storefront
// restarted, and the page kept its purchase) becomes the open purchase
// with the browser's request: its API key is the same as before the
// restart, so the API replays what it did under it.
func (s *session) payment(in payRequest) (p *Purchase, done bool) {
	if s.last != nil && s.last.Key == in.Key {
		return s.last, true
	}
	if s.open != nil && s.open.Key != in.Key {
		if s.open.Status == PurchaseSent {
			return nil, false
		}
		s.open = nil // an unsent purchase yields to the browser's sent one
	}
	if s.open == nil {
		s.open = &Purchase{Key: in.Key, Status: PurchaseOpen}
	}
	p = s.open
	if p.Status == PurchaseOpen {
		req := in
		req.Items = slices.Clone(in.Items)
		p.Request, p.Status = &req, PurchaseSent
		s.last = nil // the page shows this purchase from now on
	}
	return p, false
}

// settle records an answer to one Pay of p, whether or not its browser
// still waits for it: the attempts for the panel, the order for the
// session, and, for the first final answer, the end of the purchase (the
// cart emptied when something was bought). An invalid answer with no
// other Pay in flight opens the form again: the API executed nothing it
// found invalid, and every Pay sent the same request.
func (s *session) settle(p *Purchase, pay int, out PayResult, attempts []Attempt) {
	p.InFlight--
	for _, a := range attempts {
		a.Pay = pay
		p.Attempts = append(p.Attempts, a)
	}
	if out.OrderID != "" {
		s.remember(orderRef{ID: out.OrderID, PaymentIntentID: out.paymentIntentID,
			ThreeDS: out.Outcome == OutcomeRequiresAction, Reason: out.reason})
	}
	switch {
	case p.Status == PurchaseDone:
	case out.Final:
		res := out
		p.Result, p.Status = &res, PurchaseDone
		if s.open == p {
			s.open = nil
		}
		s.last = p
		if out.Outcome != OutcomeFailed {
			s.cart = nil // bought
		}
	case out.Outcome == OutcomeInvalid && p.InFlight == 0:
		p.Request, p.Status = nil, PurchaseOpen
	}
}

// orderURL returns the page of order id, "" for none.
func orderURL(id string) string {
	if id == "" {
		return ""
	}
	return "/orders/" + id
}

// itemsOf returns the items of a cart as a purchase's request holds them.
func itemsOf(lines []line) []client.Item {
	items := []client.Item{}
	for _, l := range lines {
		items = append(items, l.Item)
	}
	return items
}
