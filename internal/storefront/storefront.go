// Package storefront is a small web shop for one tenant of the checkout
// API, server-rendered with html/template and a little JavaScript, made to
// show an Idempotency-Key's whole life:
//
//   - the storefront keeps each session's one open purchase (Purchase):
//     its key, made when the checkout is first shown, and from its first
//     Pay its whole request (cart snapshot, email, card), until a final
//     answer; every checkout page of the session starts from it, so a
//     double click, a reload, a second tab, the Back button, or a tab
//     closed during Pay and opened again all send the same key and the
//     same body (web/checkout.js keeps a copy for a restart of the
//     storefront);
//   - Pay's call to the API runs detached from the browser's request
//     (Server.Wait drains them): a browser that goes away does not
//     abandon it, and its answer ends the purchase;
//   - the storefront server calls the API with the tenant's secret, which
//     never reaches the browser, through the public client package, with
//     the purchase's key scoped to the session (apiKey);
//   - a panel shows the key, each attempt sent to the API and each answer:
//     201, 202, 409 idempotency_key_in_use, replayed or not (Attempt);
//   - a card that needs 3D Secure goes through Stripe's redirect flow
//     (the checkout's return_url), and the order page follows the order
//     until it settles, with a cancel button while it waits, in the
//     shopper's words: product names, statuses, why a payment failed
//     (orderView).
//
// Routes:
//
//	GET  /                        products
//	POST /cart                    add sku (form: sku, quantity)
//	POST /cart/remove             remove sku
//	GET  /cart                    the cart
//	GET  /checkout                the checkout form and the key's panel
//	POST /checkout                Pay (JSON from the page): the session's open purchase, under its key
//	GET  /checkout/purchase       the session's open purchase and the last one, as JSON
//	GET  /checkout/return         back from 3D Secure (?payment_intent=pi_…): to the order's page
//	GET  /orders/{id}             the order page, which follows the order
//	GET  /orders/{id}/status      the order as JSON, for the page's polling
//	POST /orders/{id}/cancel      cancel it while it waits for 3D Secure
//	GET  /static/{file}           the page's JavaScript and CSS (no listing)
package storefront

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceonly/checkout/client"
	"github.com/onceonly/checkout/internal/tracing"
)

//go:embed web
var webFS embed.FS

// Config configures a Server.
type Config struct {
	// APIURL is the checkout API's base URL (env API_URL).
	APIURL string
	// TenantKey is the tenant's secret API key (env STOREFRONT_TENANT_KEY).
	// It is sent to the API only, never to the browser.
	TenantKey string
	// SessionSecret signs the session cookies (env
	// STOREFRONT_SESSION_SECRET); empty derives one from TenantKey. It
	// must be the same after a restart: the API keys of the purchases
	// still open depend on the sessions it signed.
	SessionSecret string
	// Retry is the client's retry policy for a checkout; zero fields take
	// the defaults below (a browser does not wait a minute for an answer).
	Retry client.RetryPolicy
	// Transport sends the requests to the API (default
	// http.DefaultTransport).
	Transport http.RoundTripper
	// Logger logs each request (method, path, route, status, duration) and
	// failures (default: none).
	Logger *slog.Logger
	// TraceUI is the base URL of a trace UI (env TRACE_UI_URL, e.g.
	// Jaeger's http://localhost:16686): when set and the process traces
	// (internal/tracing), each attempt of a Pay links to the Pay's trace
	// at TraceUI/trace/{trace id}, the click's span with the API's under it.
	TraceUI string
}

// readWait bounds a page's reads from the API (products, an order): a page
// that cannot load says so soon rather than retrying for as long as a Pay.
const readWait = 3 * time.Second

// reading returns r's context bounded by readWait.
func reading(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), readWait)
}

// DefaultCheckoutWait bounds one Pay: the client's retries of one browser
// request stop after it, and the page then says that the outcome is not
// known yet and that Pay again is safe.
const DefaultCheckoutWait = 10 * time.Second

// Server is the storefront. Create it with New; it is safe for concurrent
// use.
type Server struct {
	api      *client.Client
	logger   *slog.Logger
	traceUI  string
	sessions *sessions
	pages    map[string]*template.Template
	mux      *http.ServeMux

	// calls are the Pays' calls to the API, which outlive their browser
	// requests (Wait); payWait bounds each.
	calls   sync.WaitGroup
	payWait time.Duration

	mu sync.Mutex
	// catalog is the products last read, to check a Pay's SKUs.
	catalog []client.Product
}

// New returns a Server for cfg, or an error when cfg.APIURL is not an
// absolute http(s) URL or cfg.TenantKey is empty.
func New(cfg Config) (*Server, error) {
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Retry.MaxElapsed <= 0 {
		cfg.Retry.MaxElapsed = DefaultCheckoutWait
	}
	if cfg.Retry.AttemptTimeout <= 0 {
		cfg.Retry.AttemptTimeout = 5 * time.Second
	}
	if cfg.Retry.MaxDelay <= 0 {
		cfg.Retry.MaxDelay = time.Second
	}
	api, err := client.New(cfg.APIURL, cfg.TenantKey,
		client.WithHTTPClient(&http.Client{Transport: recorder{cfg.Transport}}),
		client.WithRetryPolicy(cfg.Retry))
	if err != nil {
		return nil, err
	}
	secret := []byte(cfg.SessionSecret)
	if len(secret) == 0 {
		m := hmac.New(sha256.New, []byte(cfg.TenantKey))
		m.Write([]byte("storefront session cookies"))
		secret = m.Sum(nil)
	}
	s := &Server{api: api, logger: cfg.Logger, traceUI: cfg.TraceUI, sessions: &sessions{secret: secret, all: map[string]*session{}},
		pages: map[string]*template.Template{}, mux: http.NewServeMux(),
		// The client stops retrying after MaxElapsed; one attempt may
		// have started just before.
		payWait: cfg.Retry.MaxElapsed + cfg.Retry.AttemptTimeout}
	funcs := template.FuncMap{"money": money}
	for _, page := range []string{"products", "cart", "checkout", "order", "message"} {
		s.pages[page] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(webFS, "web/layout.html", "web/"+page+".html"))
	}
	static, _ := fs.Sub(webFS, "web")
	s.mux.Handle("GET /static/{file}", staticFiles(static))
	s.mux.HandleFunc("GET /{$}", s.products)
	s.mux.HandleFunc("POST /cart", s.addToCart)
	s.mux.HandleFunc("POST /cart/remove", s.removeFromCart)
	s.mux.HandleFunc("GET /cart", s.cart)
	s.mux.HandleFunc("GET /checkout", s.checkoutForm)
	s.mux.HandleFunc("POST /checkout", s.pay)
	s.mux.HandleFunc("GET /checkout/purchase", s.purchaseState)
	s.mux.HandleFunc("GET /checkout/return", s.returned)
	s.mux.HandleFunc("GET /orders/{id}", s.orderPage)
	s.mux.HandleFunc("GET /orders/{id}/status", s.orderStatus)
	s.mux.HandleFunc("POST /orders/{id}/cancel", s.cancel)
	return s, nil
}

// staticFiles serves the page's scripts and stylesheet from dir by name:
// no directory listing (the templates are in dir too), nothing else.
func staticFiles(dir fs.FS) http.Handler {
	files := http.FileServerFS(dir)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("file")
		if ext := path.Ext(name); ext != ".js" && ext != ".css" {
			http.NotFound(w, r)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + name
		files.ServeHTTP(w, r2)
	})
}

// ServeHTTP serves the routes of the package documentation.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	s.mux.ServeHTTP(rec, r)
	// One line per request, as the api logs them. The path only: a return
	// from 3D Secure carries the PaymentIntent's client secret in its query.
	s.logger.LogAttrs(r.Context(), slog.LevelInfo, "http request",
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("route", r.Pattern), slog.Int("status", rec.status),
		slog.Int64("duration_ms", time.Since(start).Milliseconds()))
}

// statusRecorder is a ResponseWriter that remembers the status written, for
// the request log.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

// WriteHeader records code and writes it.
func (w *statusRecorder) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap gives http.ResponseController the writer underneath.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// render writes page with data, or a 500.
func (s *Server) render(w http.ResponseWriter, status int, page string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := s.pages[page].Execute(w, data); err != nil {
		s.logger.Error("storefront: render", "page", page, "err", err)
	}
}

// message renders a page that only says something.
func (s *Server) message(w http.ResponseWriter, status int, title, text string) {
	s.render(w, status, "message", map[string]any{"Title": title, "Text": text})
}

// apiFailed answers a page whose API call failed.
func (s *Server) apiFailed(w http.ResponseWriter, r *http.Request, err error) {
	s.logger.WarnContext(r.Context(), "storefront: API call failed", "path", r.URL.Path, "err", err)
	if client.IsCode(err, client.CodeNotFound) {
		s.message(w, http.StatusNotFound, "Not found", "There is no such order.")
		return
	}
	s.message(w, http.StatusBadGateway, "The shop cannot reach the checkout service",
		"Try again in a moment. ("+err.Error()+")")
}

// line is a cart line with its product.
type line struct {
	client.Item
	Product client.Product
	Amount  int64
}

// products serves GET /.
func (s *Server) products(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := reading(r)
	defer cancel()
	ps, err := s.listProducts(ctx)
	if err != nil {
		s.apiFailed(w, r, err)
		return
	}
	var count int
	s.sessions.with(w, r, func(ss *session) {
		for _, it := range ss.cart {
			count += it.Quantity
		}
	})
	s.render(w, http.StatusOK, "products", map[string]any{"Products": ps.Products, "CartCount": count})
}

// addToCart serves POST /cart (sku, quantity 1..100).
func (s *Server) addToCart(w http.ResponseWriter, r *http.Request) {
	q, err := strconv.Atoi(r.FormValue("quantity"))
	if err != nil || q < 1 || q > 100 {
		q = 1
	}
	sku := r.FormValue("sku")
	if sku == "" || len(sku) > 64 {
		s.message(w, http.StatusBadRequest, "No such product", "Pick a product from the list.")
		return
	}
	s.sessions.with(w, r, func(ss *session) { ss.add(sku, q) })
	http.Redirect(w, r, "/cart", http.StatusSeeOther)
}

// removeFromCart serves POST /cart/remove (sku).
func (s *Server) removeFromCart(w http.ResponseWriter, r *http.Request) {
	s.sessions.with(w, r, func(ss *session) { ss.remove(r.FormValue("sku")) })
	http.Redirect(w, r, "/cart", http.StatusSeeOther)
}

// cartLines returns the session's cart with prices from the catalog.
func (s *Server) cartLines(w http.ResponseWriter, r *http.Request) ([]line, int64, error) {
	var items []client.Item
	s.sessions.with(w, r, func(ss *session) { items = append(items, ss.cart...) })
	if len(items) == 0 {
		return nil, 0, nil
	}
	ctx, cancel := reading(r)
	defer cancel()
	ps, err := s.listProducts(ctx)
	if err != nil {
		return nil, 0, err
	}
	bySKU := map[string]client.Product{}
	for _, p := range ps.Products {
		bySKU[p.SKU] = p
	}
	var lines []line
	var total int64
	for _, it := range items {
		p := bySKU[it.SKU]
		lines = append(lines, line{Item: it, Product: p, Amount: p.UnitAmount * int64(it.Quantity)})
		total += p.UnitAmount * int64(it.Quantity)
	}
	return lines, total, nil
}

// cart serves GET /cart.
func (s *Server) cart(w http.ResponseWriter, r *http.Request) {
	lines, total, err := s.cartLines(w, r)
	if err != nil {
		s.apiFailed(w, r, err)
		return
	}
	s.render(w, http.StatusOK, "cart", map[string]any{"Lines": lines, "Total": total})
}

// checkoutForm serves GET /checkout: the form and the panel of the
// session's open purchase (made now when there is none), and how the one
// before it ended. A reload, a second tab, the Back button and a tab
// opened again after one closed during Pay all show the same purchase,
// under the same key, until its final answer.
func (s *Server) checkoutForm(w http.ResponseWriter, r *http.Request) {
	lines, total, err := s.cartLines(w, r)
	if err != nil {
		s.apiFailed(w, r, err)
		return
	}
	var view checkoutView
	s.sessions.with(w, r, func(ss *session) { view = ss.view() })
	cart, _ := json.Marshal(itemsOf(lines))
	state, _ := json.Marshal(view)
	s.render(w, http.StatusOK, "checkout", map[string]any{"Lines": lines, "Total": total,
		"Items": string(cart), "State": string(state)})
}

// purchaseState serves GET /checkout/purchase: the checkoutView as JSON,
// which a checkout page polls while its purchase's call to the API runs
// without it (a Pay of a tab since closed).
func (s *Server) purchaseState(w http.ResponseWriter, r *http.Request) {
	var view checkoutView
	s.sessions.with(w, r, func(ss *session) { view = ss.view() })
	writeJSON(w, http.StatusOK, view)
}

// payRequest is the body the checkout page posts on Pay: the whole
// purchase, as the page stored it at the first Pay. Every Pay of the
// purchase sends the same one, so the API gets the same body under the
// same key, whatever the cart or the form became meanwhile, and whether
// or not the storefront restarted.
type payRequest struct {
	Key           string        `json:"key"`
	Items         []client.Item `json:"items"`
	Email         string        `json:"email"`
	PaymentMethod string        `json:"payment_method"`
}

// catalogFor returns the catalog that has skus: the one last read
// (by any page), read again (bounded by readWait) when it is missing one.
func (s *Server) catalogFor(ctx context.Context, skus []string) ([]client.Product, error) {
	s.mu.Lock()
	catalog := s.catalog
	s.mu.Unlock()
	for _, sku := range skus {
		if !slices.ContainsFunc(catalog, func(p client.Product) bool { return p.SKU == sku }) {
			ctx, cancel := context.WithTimeout(ctx, readWait)
			defer cancel()
			ps, err := s.listProducts(ctx)
			if err != nil {
				return nil, err
			}
			return ps.Products, nil
		}
	}
	return catalog, nil
}

// listProducts reads the catalog and keeps it for catalogFor.
func (s *Server) listProducts(ctx context.Context) (*client.ProductsResult, error) {
	ps, err := s.api.ListProducts(ctx)
	if err == nil {
		s.mu.Lock()
		s.catalog = ps.Products
		s.mu.Unlock()
	}
	return ps, err
}

// maxLines bounds a purchase's lines.
const maxLines = 20

// checkItems says what is wrong with a purchase's items, "" when nothing:
// 1..maxLines lines of catalog SKUs, each once, quantities 1..100.
func checkItems(items []client.Item, catalog []client.Product) string {
	if len(items) == 0 {
		return "Your cart is empty."
	}
	if len(items) > maxLines {
		return "Too many lines in the cart."
	}
	seen := map[string]bool{}
	for _, it := range items {
		known := slices.ContainsFunc(catalog, func(p client.Product) bool { return p.SKU == it.SKU })
		if !known || seen[it.SKU] || it.Quantity < 1 || it.Quantity > 100 {
			return "The purchase has an unknown product or a bad quantity."
		}
		seen[it.SKU] = true
	}
	return ""
}

// PayResult is the storefront's answer to one Pay: what the page shows in
// its panel and does next.
type PayResult struct {
	// Outcome says what the answer means for the purchase.
	Outcome Outcome `json:"outcome"`
	// Final tells the page that the purchase is over: a new one needs a
	// new key.
	Final bool `json:"final"`
	// Message is for the customer.
	Message string `json:"message"`
	// OrderID is the order, when there is one; OrderURL its page.
	OrderID  string `json:"order_id,omitempty"`
	OrderURL string `json:"order_url,omitempty"`
	// Key is the purchase the answer is about: the page's own, or, when
	// the page is stale (another purchase of the session was sent since
	// it loaded), that other one's, which the page then shows.
	Key string `json:"key"`
	// APIKey is the Idempotency-Key sent to the API.
	APIKey string `json:"api_key"`
	// Attempts are the requests sent to the API for the purchase so far,
	// each with the Pay it belongs to.
	Attempts []Attempt `json:"attempts"`

	// paymentIntentID is the order's PaymentIntent, for the return from
	// 3D Secure; reason why its payment failed, for its page.
	paymentIntentID, reason string
}

// pay serves POST /checkout: one Pay of the session's open purchase. The
// purchase's request is fixed at its first Pay and every Pay sends it, so
// the API gets the same body under the same key whatever the form became
// meanwhile; the API key comes from the signed session and the purchase's
// key (apiKey). The call to the API runs detached from the browser's
// request: a tab closed, reloaded or gone away during Pay does not
// abandon it, and its answer ends the purchase (cart emptied, order
// remembered) for whichever page of the session asks next. A storefront
// restarted since the page's first Pay adopts the page's stored request,
// under the same API key. The return_url brings the customer back here
// after 3D Secure. Only the session's open purchase is sent
// (session.payment): a Pay of any other purchase (a page out of date) sends
// nothing, changes nothing and is answered 409 OutcomeStale with the
// current purchase. The answer is JSON (PayResult), 200 for every answer of
// the API, 400 for a request the page should not have sent or one without
// the session cookie (the page that sends Pay sets it).
func (s *Server) pay(w http.ResponseWriter, r *http.Request) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		// The form posted without the page's script: it carries no key.
		s.message(w, http.StatusBadRequest, "This checkout needs JavaScript",
			"The checkout keeps your purchase's key with a script, so that a retry can never charge you twice. "+
				"Turn JavaScript on for this shop and open the checkout again. Nothing was charged.")
		return
	}
	var in payRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<14)).Decode(&in); err != nil || !browserKey.MatchString(in.Key) {
		writeJSON(w, http.StatusBadRequest, PayResult{Outcome: OutcomeInvalid, Message: "The page sent no valid key; reload it."})
		return
	}
	skus := make([]string, len(in.Items))
	for i, it := range in.Items {
		skus[i] = it.SKU
	}
	catalog, err := s.catalogFor(r.Context(), skus)
	if err != nil {
		writeJSON(w, http.StatusOK, PayResult{Outcome: OutcomeUnknown, Key: in.Key,
			Message: "The shop cannot reach the checkout service. Press Pay again in a moment: it is safe."})
		return
	}
	if bad := checkItems(in.Items, catalog); bad != "" {
		writeJSON(w, http.StatusBadRequest, PayResult{Outcome: OutcomeInvalid, Key: in.Key, Message: bad})
		return
	}
	sessionID, ok := s.sessions.existing(r)
	if !ok {
		// Every Pay without the cookie would be a new session, so a new
		// API key: a double click, two charges. Nothing is sent.
		writeJSON(w, http.StatusBadRequest, PayResult{Outcome: OutcomeInvalid, Key: in.Key,
			Message: "This shop needs its cookie to take a payment: allow cookies for it and reload the page. Nothing was charged."})
		return
	}
	var (
		p         *Purchase
		view      *Purchase
		done      bool
		stale     *Purchase
		pay       int
		request   payRequest
		returnURL = "http://" + r.Host + "/checkout/return"
	)
	s.sessions.byID(sessionID, func(ss *session) {
		p, done = ss.payment(in)
		switch {
		case p == nil:
			stale = ss.current().view()
		case !done:
			p.Pays++
			p.InFlight++
			pay = p.Pays
			p.APIKey = apiKey(sessionID, "checkout", p.Key)
			request = *p.Request
		}
		view = p.view()
	})
	switch {
	case stale != nil:
		// Nothing sent, nothing changed: the page shows the current
		// purchase instead.
		msg := "This page was out of date: its purchase is over, or another one was started since. " +
			"Nothing was sent and your cart is as it was. Here is your current purchase: check it and press Pay."
		if stale.Status == PurchaseSent {
			msg = "This page was out of date: another purchase of yours is being paid. Nothing more was sent; here it is."
		}
		writeJSON(w, http.StatusConflict, PayResult{Outcome: OutcomeStale, Key: stale.Key, APIKey: stale.APIKey,
			Attempts: stale.Attempts, Message: msg})
		return
	case done:
		out := *view.Result
		out.Attempts = view.Attempts
		writeJSON(w, http.StatusOK, out)
		return
	}
	answered := make(chan PayResult, 1)
	s.calls.Go(func() {
		// Detached from the browser's request: its answer ends the
		// purchase whether or not anyone still waits for it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.payWait)
		defer cancel()
		// One span per Pay, parent of the API calls it makes (their
		// traceparent), so that the trace runs from the click to the email.
		ctx, span := tracing.Start(ctx, "storefront pay", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		ctx, log := withAttemptLog(ctx)
		res, err := s.api.CreateCheckout(ctx, view.APIKey, client.CheckoutRequest{
			Email: request.Email, Items: request.Items, PaymentMethod: request.PaymentMethod,
			// Constant for the purchase: it is part of the key's fingerprint.
			ReturnURL: returnURL,
		})
		out := s.payResult(err, res)
		out.Key, out.APIKey, out.OrderURL = view.Key, view.APIKey, orderURL(out.OrderID)
		if res != nil {
			out.paymentIntentID = res.Order.Payment.PaymentIntentID
		}
		attempts := log.list()
		if sc := span.SpanContext(); s.traceUI != "" && sc.IsSampled() {
			for i := range attempts {
				attempts[i].TraceURL = strings.TrimRight(s.traceUI, "/") + "/trace/" + sc.TraceID().String()
			}
		}
		s.sessions.byID(sessionID, func(ss *session) {
			ss.settle(p, pay, out, attempts)
			out.Attempts = slices.Clone(p.Attempts)
		})
		answered <- out
	})
	select {
	case out := <-answered:
		writeJSON(w, http.StatusOK, out)
	case <-r.Context().Done():
		// The browser went away; the call goes on and settles the purchase.
	}
}

// Wait blocks until every call to the API that a Pay started has
// finished, each within the client's retry policy: a shutdown drains
// them after the HTTP server's own drain, so that no purchase is left
// without its answer.
func (s *Server) Wait() {
	s.calls.Wait()
}

// payResult tells the page what an answer means for the purchase.
func (s *Server) payResult(err error, res *client.OrderResult) PayResult {
	if err == nil {
		if res.Order.Status == client.OrderRequiresAction {
			return PayResult{Outcome: OutcomeRequiresAction, Final: true, OrderID: res.Order.ID,
				Message: "Your bank asks you to confirm the payment (3D Secure)."}
		}
		return PayResult{Outcome: OutcomePaid, Final: true, OrderID: res.Order.ID, Message: "Paid. Thank you!"}
	}
	var e *client.Error
	if !errors.As(err, &e) {
		s.logger.Error("storefront: checkout", "err", err)
		return PayResult{Outcome: OutcomeUnknown, Message: "Something went wrong. Pay again: it is safe."}
	}
	switch {
	case e.Temporary():
		return PayResult{Outcome: OutcomeUnknown, Message: "No answer from the checkout service yet: we do not know " +
			"whether you paid. Press Pay again; the same key makes it safe, you will not pay twice."}
	case e.Code == client.CodeValidationError:
		var fields []string
		for _, f := range e.Errors {
			fields = append(fields, f.Field+" "+f.Message)
		}
		return PayResult{Outcome: OutcomeInvalid, Message: "Please fix: " + strings.Join(fields, "; ") + "."}
	case e.Code == client.CodeCardDeclined:
		why := declineText(e.DeclineCode)
		return PayResult{Outcome: OutcomeFailed, Final: true, OrderID: e.OrderID, reason: why,
			Message: why + " Choose another card and press Pay: that is a new purchase."}
	case e.Code == client.CodePaymentRejected:
		why := "The payment was refused (" + cmp.Or(e.Detail, e.Title) + "). Nothing was charged."
		return PayResult{Outcome: OutcomeFailed, Final: true, OrderID: e.OrderID, reason: why,
			Message: why + " Choose another card and press Pay: that is a new purchase."}
	case e.Code == client.CodeIdempotencyKeyReused:
		// Not an outcome of the purchase: its first request, with its
		// original details, may be paid in a moment. Keep the key; a new
		// purchase now could be a second charge.
		return PayResult{Outcome: OutcomeUnknown, Message: "This purchase is still being processed with its " +
			"original details. Press Pay again in a moment to see its outcome; do not start a new one."}
	case e.Code == client.CodeOutOfStock:
		// Stored under the key: the purchase's outcome.
		return PayResult{Outcome: OutcomeFailed, Final: true, Message: e.Title + ": " + e.Detail}
	default:
		// Stored under no key (500 internal, a refusal of the request
		// itself): the work it interrupted may still be finished, and
		// charge, so the purchase stays open under its key; a new one now
		// could be a second charge.
		s.logger.Error("storefront: checkout", "status", e.Status, "code", e.Code, "detail", e.Detail)
		return PayResult{Outcome: OutcomeUnknown, Message: "The checkout service answered " + cmp.Or(e.Title, string(e.Code)) +
			". We do not know yet whether you paid: press Pay again in a moment; the same key makes it safe."}
	}
}

// returned serves GET /checkout/return?payment_intent=pi_…: Stripe sends
// the customer here after 3D Secure; the page of the session's order with
// that PaymentIntent follows it until it settles.
func (s *Server) returned(w http.ResponseWriter, r *http.Request) {
	pi := r.URL.Query().Get("payment_intent")
	var id string
	s.sessions.with(w, r, func(ss *session) {
		for _, o := range ss.orders {
			if pi != "" && o.PaymentIntentID == pi {
				id = o.ID
			}
		}
		if id != "" && r.URL.Query().Get("redirect_status") == "failed" {
			// Stripe's word that the challenge failed: the order page
			// says why its payment failed.
			ss.remember(orderRef{ID: id, Reason: reasonThreeDSFailed})
		}
	})
	if id == "" {
		s.message(w, http.StatusNotFound, "Unknown payment", "This browser has no order with that payment.")
		return
	}
	http.Redirect(w, r, "/orders/"+id, http.StatusSeeOther)
}

// sessionOrder loads the session's order {id} as its page shows it, or
// answers 404 (the page's, or JSON when asJSON).
func (s *Server) sessionOrder(w http.ResponseWriter, r *http.Request, asJSON bool) (orderView, bool) {
	id := r.PathValue("id")
	var ref orderRef
	var mine bool
	s.sessions.with(w, r, func(ss *session) { ref, mine = ss.order(id) })
	if !mine {
		if asJSON {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such order"})
		} else {
			s.message(w, http.StatusNotFound, "Not found", "This browser has no such order.")
		}
		return orderView{}, false
	}
	ctx, cancel := reading(r)
	defer cancel()
	res, err := s.api.GetOrder(ctx, id)
	var catalog []client.Product
	if err == nil {
		skus := make([]string, len(res.Order.Items))
		for i, it := range res.Order.Items {
			skus[i] = it.SKU
		}
		catalog, err = s.catalogFor(ctx, skus)
	}
	if err != nil {
		if asJSON {
			writeJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		} else {
			s.apiFailed(w, r, err)
		}
		return orderView{}, false
	}
	return viewOf(&res.Order, ref, catalog), true
}

// orderPage serves GET /orders/{id}.
func (s *Server) orderPage(w http.ResponseWriter, r *http.Request) {
	if v, ok := s.sessionOrder(w, r, false); ok {
		s.render(w, http.StatusOK, "order", v)
	}
}

// orderStatus serves GET /orders/{id}/status: the orderView as JSON.
func (s *Server) orderStatus(w http.ResponseWriter, r *http.Request) {
	if v, ok := s.sessionOrder(w, r, true); ok {
		writeJSON(w, http.StatusOK, v)
	}
}

// cancel serves POST /orders/{id}/cancel. Its key is the order's (scoped
// to the session): a cancellation is one operation per order, so a second
// click or a resubmitted form replays it.
func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var sessionID string
	var mine bool
	s.sessions.with(w, r, func(ss *session) { sessionID = ss.id; _, mine = ss.order(id) })
	if !mine {
		s.message(w, http.StatusNotFound, "Not found", "This browser has no such order.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), DefaultCheckoutWait)
	defer cancel()
	_, err := s.api.CancelOrder(ctx, id, apiKey(sessionID, "cancel", id))
	if err != nil && !client.IsCode(err, client.CodeOrderNotCancelable) {
		s.apiFailed(w, r, err)
		return
	}
	if err == nil {
		s.sessions.byID(sessionID, func(ss *session) { ss.remember(orderRef{ID: id, Reason: reasonCanceled}) })
	}
	// Canceled, or not cancelable any more (paid or failed meanwhile):
	// the order page shows which.
	http.Redirect(w, r, "/orders/"+id, http.StatusSeeOther)
}

// money formats minor units of currency, e.g. 2500 usd as "$25.00".
func money(amount int64, currency string) string {
	s := strconv.FormatInt(amount/100, 10) + "." + strconv.FormatInt(amount%100/10, 10) + strconv.FormatInt(amount%10, 10)
	if strings.EqualFold(currency, "usd") {
		return "$" + s
	}
	return s + " " + strings.ToUpper(currency)
}

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
