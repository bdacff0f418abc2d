package storefront

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/onceonly/checkout/client"
)

// sessionCookie names the cookie that holds a browser's session id.
const sessionCookie = "storefront_session"

// session is one browser's state. Its id lives in the browser's cookie,
// signed with the storefront's secret, so it survives a restart of the
// storefront: the API keys derived from it (apiKey) are the same after
// one. The cart, the orders and the open purchase are in memory, and a
// restart forgets them; a purchase sent before the restart survives it:
// the page keeps a copy of its request (web/checkout.js), which the next
// Pay gives back, and the API keeps its order.
type session struct {
	id string
	// cart is the SKUs and quantities in the order they were added.
	cart []client.Item
	// orders are the session's orders, newest last: a browser sees only
	// its own, though the tenant's secret could read every order.
	orders []orderRef
	// open is the session's one open purchase (nil until the checkout is
	// shown or a Pay comes); last is the one before it, once done, until
	// the open one is sent: a checkout opened again after its tab closed
	// shows how the purchase ended.
	open, last *Purchase
}

// orderRef is an order of the session, with its PaymentIntent so that a
// customer back from 3D Secure (?payment_intent=pi_…) finds it, and what
// the storefront learned of its payment that the API's order does not say.
type orderRef struct {
	ID, PaymentIntentID string
	// ThreeDS: the order asked for 3D Secure.
	ThreeDS bool
	// Reason says why its payment failed, in the shopper's words, when
	// the storefront saw it fail (a decline, a failed 3D Secure, a cancel).
	Reason string
}

// sessions holds every session; it is safe for concurrent use.
type sessions struct {
	// secret signs the session cookies: a browser cannot make up a
	// session id, nor take another's without its cookie.
	secret []byte
	mu     sync.Mutex
	all    map[string]*session
}

// sign returns the cookie's value for session id: id.HMAC(secret, id).
func (ss *sessions) sign(id string) string {
	m := hmac.New(sha256.New, ss.secret)
	m.Write([]byte(id))
	return id + "." + hex.EncodeToString(m.Sum(nil))
}

// verify returns the session id of a cookie's value, if its signature is
// the storefront's.
func (ss *sessions) verify(value string) (string, bool) {
	id, _, ok := strings.Cut(value, ".")
	if !ok || !hmac.Equal([]byte(ss.sign(id)), []byte(value)) {
		return "", false
	}
	return id, true
}

// existing returns the id of the request's session when its cookie is one
// the storefront signed, and false when there is none (cookies blocked or
// cleared): a Pay must not make a new session, whose API key for the
// browser's key would be another purchase at every click.
func (ss *sessions) existing(r *http.Request) (string, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return "", false
	}
	return ss.verify(c.Value)
}

// with runs fn with the request's session: the one of its signed cookie
// (in memory again, with an empty cart, after a restart), or a new one
// whose cookie it sets. fn runs with the sessions locked, so it must not
// block.
func (ss *sessions) with(w http.ResponseWriter, r *http.Request, fn func(*session)) {
	var id string
	if c, err := r.Cookie(sessionCookie); err == nil {
		id, _ = ss.verify(c.Value)
	}
	if id == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		id = hex.EncodeToString(b[:])
		c := &http.Cookie{Name: sessionCookie, Value: ss.sign(id), Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode}
		http.SetCookie(w, c)
		// The request's later calls find the same session.
		r.Header.Del("Cookie")
		r.AddCookie(c)
	}
	ss.byID(id, fn)
}

// byID runs fn with session id, in memory again (empty) when the
// storefront restarted since. fn runs with the sessions locked, so it must
// not block.
func (ss *sessions) byID(id string, fn func(*session)) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.all[id]
	if s == nil {
		s = &session{id: id}
		ss.all[id] = s
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

// order returns the session's order id, if it is one.
func (s *session) order(id string) (orderRef, bool) {
	for _, o := range s.orders {
		if o.ID == id {
			return o, true
		}
	}
	return orderRef{}, false
}

// remember records an order of the session (once), or what more is
// known of it.
func (s *session) remember(o orderRef) {
	for i := range s.orders {
		if p := &s.orders[i]; p.ID == o.ID {
			p.PaymentIntentID = cmp.Or(o.PaymentIntentID, p.PaymentIntentID)
			p.ThreeDS = p.ThreeDS || o.ThreeDS
			p.Reason = cmp.Or(o.Reason, p.Reason)
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
// logs and tables. The session id is the signed cookie's, so the hash is
// the same after a restart of the storefront: a purchase retried across
// one is still one purchase.
func apiKey(sessionID, purpose, key string) string {
	sum := sha256.Sum256([]byte(sessionID + "\x00" + purpose + "\x00" + key))
	return "sf_" + hex.EncodeToString(sum[:20])
}
