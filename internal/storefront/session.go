package storefront

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"regexp"
	"slices"
	"sync"

	"github.com/onceonly/checkout/client"
)

// sessionCookie names the cookie that holds a browser's session id.
const sessionCookie = "storefront_session"

// session is one browser's state, in memory: a restart of the storefront
// forgets carts and purchases (the orders stay in the API).
type session struct {
	id string
	// cart is the SKUs and quantities in the order they were added.
	cart []client.Item
	// purchases are the items of each purchase, by the browser's key,
	// frozen at its first Pay: every retry of a purchase sends the same
	// items, even after the cart has been emptied by its first answer.
	purchases map[string][]client.Item
	// orders are the session's orders, newest last: a browser sees only
	// its own, though the tenant's secret could read every order.
	orders []orderRef
}

// orderRef is an order of the session, with its PaymentIntent so that a
// customer back from 3D Secure (?payment_intent=pi_…) finds it.
type orderRef struct {
	ID, PaymentIntentID string
}

// sessions holds every session; it is safe for concurrent use.
type sessions struct {
	mu   sync.Mutex
	byID map[string]*session
}

// get returns the request's session, making one (and setting its cookie)
// when the request has none or an unknown one. fn runs with the sessions
// locked, so it must not block.
func (ss *sessions) with(w http.ResponseWriter, r *http.Request, fn func(*session)) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var s *session
	if c, err := r.Cookie(sessionCookie); err == nil {
		s = ss.byID[c.Value]
	}
	if s == nil {
		var b [16]byte
		_, _ = rand.Read(b[:])
		s = &session{id: hex.EncodeToString(b[:]), purchases: map[string][]client.Item{}}
		ss.byID[s.id] = s
		http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.id, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	}
	fn(s)
}

// add puts quantity of sku in the cart.
func (s *session) add(sku string, quantity int) {
	for i := range s.cart {
		if s.cart[i].SKU == sku {
			s.cart[i].Quantity = min(s.cart[i].Quantity+quantity, 100)
			return
		}
	}
	s.cart = append(s.cart, client.Item{SKU: sku, Quantity: quantity})
}

// remove takes sku out of the cart.
func (s *session) remove(sku string) {
	s.cart = slices.DeleteFunc(s.cart, func(it client.Item) bool { return it.SKU == sku })
}

// purchase returns the items of the purchase under the browser's key: the
// ones frozen at its first Pay, or else the cart's, frozen now (nil when
// the cart is empty).
func (s *session) purchase(browserKey string) []client.Item {
	if items, ok := s.purchases[browserKey]; ok {
		return items
	}
	if len(s.cart) == 0 {
		return nil
	}
	items := slices.Clone(s.cart)
	s.purchases[browserKey] = items
	return items
}

// order returns the session's order id, if it is one.
func (s *session) order(id string) (orderRef, bool) {
	for _, o := range s.orders {
		if o.ID == id {
			return o, true
		}
	}
	return orderRef{}, false
}

// remember records an order of the session (once).
func (s *session) remember(o orderRef) {
	for i := range s.orders {
		if s.orders[i].ID == o.ID {
			s.orders[i] = o
			return
		}
	}
	s.orders = append(s.orders, o)
}

// browserKey is what the browser may send as its key: made by
// crypto.randomUUID() in the page, or anything of the same sort.
var browserKey = regexp.MustCompile(`^[A-Za-z0-9_-]{8,64}$`)

// apiKey scopes a browser's key to its session: the Idempotency-Key the
// storefront sends to the API is a hash of both. Every shopper is the same
// tenant at the API, whose scope is (tenant, route, key): with the
// browser's key sent as it is, a key copied from someone else's page (the
// panel shows it) would replay their answer, their order and email
// included. The hash keeps the session id, a secret, out of the API's
// logs and tables, and is the same after a restart of the storefront, so
// a purchase retried across one is still one purchase.
func apiKey(sessionID, purpose, key string) string {
	sum := sha256.Sum256([]byte(sessionID + "\x00" + purpose + "\x00" + key))
	return "sf_" + hex.EncodeToString(sum[:20])
}
