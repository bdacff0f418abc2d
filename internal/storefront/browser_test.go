package storefront_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/storefront"
	"github.com/onceonly/checkout/internal/testenv"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// The browser tests drive the storefront in headless Chromium (Debian's
// chromium, through chromedp) against the whole stack as processes
// (tests/e2e/stack: Stripe emulator, SMTP sink, api, dispatcher, worker,
// webhooks on). The storefront runs in the test, and reaches the api
// through a toxiproxy link that a test can make drop the api's answers.
// One stack and one browser serve every test of the package; each test
// has a browser context of its own (cookies, sessionStorage) and an email
// of its own, by which it counts its orders, and counts the charges of
// those orders at the emulator.

// shared is the package's stack and browser, started by the first test.
var shared struct {
	once sync.Once
	env  *env
	err  error
	main mainTB
}

// env is what every browser test uses.
type env struct {
	st      *stack.Stack
	apiLink *stack.Proxy // storefront -> api
	shopURL string
	browser context.Context // a chromedp context whose browser runs
}

func TestMain(m *testing.M) {
	code := m.Run()
	shared.main.cleanup()
	os.Exit(code)
}

// chromiumPath finds Debian's chromium (or $CHROMIUM).
func chromiumPath() (string, error) {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("chromium not found in PATH (nor $CHROMIUM): the browser tests need it; " +
		"install it with `apt-get install chromium` (.ci/run does when it is missing)")
}

// setup returns the shared env, starting it on first use; a test fails
// (never skips) when it cannot start, chromium missing included.
func setup(t *testing.T) *env {
	t.Helper()
	shared.once.Do(func() { shared.env, shared.err = start(&shared.main) })
	require.NoError(t, shared.err)
	return shared.env
}

func start(tb *mainTB) (e *env, err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			err = errors.New(string(f))
		}
	}()
	chromium, err := chromiumPath()
	if err != nil {
		return nil, err
	}
	bin, err := os.MkdirTemp("", "storefront-bin-")
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { os.RemoveAll(bin) })
	if err := stack.Build(bin); err != nil {
		return nil, err
	}
	st := stack.Start(tb, stack.Options{BinDir: bin, Webhooks: true})
	apiAddr, err := stack.HostPort(st.APIURL)
	if err != nil {
		return nil, err
	}
	link, err := st.AddProxy("storefront-api", apiAddr)
	if err != nil {
		return nil, err
	}
	shop, err := storefront.New(storefront.Config{APIURL: "http://" + link.Addr(), TenantKey: "sk_test_acme",
		// A Pay whose answers are all lost gives up quickly, as the
		// lost-answer test needs.
		Retry: testRetry})
	if err != nil {
		return nil, err
	}
	tb.Cleanup(shop.Wait) // after srv.Close: the Pays' calls end too
	srv := httptest.NewServer(shop)
	tb.Cleanup(srv.Close)

	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.WindowSize(1200, 900))
	tb.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	tb.Cleanup(cancelBrowser)
	if err := chromedp.Do(browser); err != nil { // starts the browser
		return nil, fmt.Errorf("start chromium %s: %w", chromium, err)
	}
	return &env{st: st, apiLink: link, shopURL: srv.URL, browser: browser}, nil
}

// tab returns a new tab in a browser context of its own (no cookies, no
// sessionStorage shared with other tests), bounded by d.
func (e *env) tab(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(e.browser, chromedp.WithNewBrowserContext())
	require.NoError(t, chromedp.Do(ctx))
	tctx, cancelT := context.WithTimeout(ctx, d)
	t.Cleanup(func() { cancelT(); cancel() })
	return tctx
}

// do runs browser actions, failing the test on error.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// click clicks the element sel (a CSS selector) selects, with the mouse
// at its centre, as a user does. chromedp finds the node and then, in
// further commands, scrolls to it and reads its box: a page that has just
// loaded can replace its document in between, and Chrome answers "Could
// not find node with given id" (chromedp issue #1001), before any mouse
// event is sent. Only that answer is tried again, for up to 5 s.
func click(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(sel)))
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "Could not find node with given id") || time.Now().After(deadline) {
			require.NoError(t, err, "click %s", sel)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// eval returns a JavaScript expression's value.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, expr)
	return v
}

// until polls a JavaScript expression until it is true, across page
// loads, or fails the test after d.
func until(t *testing.T, ctx context.Context, d time.Duration, expr string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			url, _ := chromedp.Run(ctx, chromedp.Location())
			text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
			t.Fatalf("timed out after %s waiting for %s (last error %v) on %s:\n%s", d, expr, err, url, text)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// email returns an address of the test's own.
func email(name string) string {
	return strings.ToLower(name) + "-" + testenv.Random(6) + "@example.com"
}

// toCheckout puts a tee in the cart and opens the checkout form, filled
// with buyer and card.
func (e *env) toCheckout(t *testing.T, ctx context.Context, buyer, card string) {
	t.Helper()
	do(t, ctx, chromedp.Navigate(e.shopURL+"/"))
	click(t, ctx, "#add-sku_tee")
	until(t, ctx, 10*time.Second, `document.getElementById("to-checkout")`)
	click(t, ctx, "#to-checkout")
	e.fillCheckout(t, ctx, buyer, card)
}

// fillCheckout waits for the checkout form and fills it.
func (e *env) fillCheckout(t *testing.T, ctx context.Context, buyer, card string) {
	t.Helper()
	until(t, ctx, 10*time.Second, `document.getElementById("browser-key") && document.getElementById("browser-key").textContent !== "…"`)
	do(t, ctx, chromedp.SetValue(chromedp.CSS("#email"), buyer), chromedp.SetValue(chromedp.CSS("#payment-method"), card))
}

// panelRow is one attempt as the panel shows it.
type panelRow struct {
	Pay, Attempt, Answer, Replayed string
}

// panel returns the panel's browser key and rows.
func panel(t *testing.T, ctx context.Context) (key string, rows []panelRow) {
	t.Helper()
	key = eval[string](t, ctx, `document.getElementById("browser-key").textContent`)
	cells := eval[[][]string](t, ctx, `[...document.querySelectorAll("#attempts tbody tr")].map(tr => [...tr.cells].map(td => td.textContent))`)
	for _, c := range cells {
		rows = append(rows, panelRow{c[0], c[1], c[2], c[3]})
	}
	return key, rows
}

// orders returns the ids of the orders with buyer's email.
func (e *env) orders(t *testing.T, buyer string) []string {
	t.Helper()
	rows, err := e.st.DB.Query(context.Background(), `SELECT id FROM orders WHERE email = $1 ORDER BY created_at`, buyer)
	require.NoError(t, err)
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	return ids
}

// intents returns order's PaymentIntents at the emulator.
func (e *env) intents(order string) []stack.PaymentIntent {
	return stack.IntentsByOrder(e.st.PaymentIntents())[order]
}

// orderStatus is order's status in the database.
func (e *env) orderStatus(t *testing.T, order string) string {
	t.Helper()
	var s string
	require.NoError(t, e.st.DB.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, order).Scan(&s))
	return s
}

// fatal is mainTB's Fatalf, carried by a panic out of start.
type fatal string

// mainTB is the stack.TB of the shared stack: its cleanups run after every
// test (TestMain).
type mainTB struct {
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

func (m *mainTB) Helper()                         {}
func (m *mainTB) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (m *mainTB) Failed() bool                    { m.mu.Lock(); defer m.mu.Unlock(); return m.failed }
func (m *mainTB) Cleanup(f func()) {
	m.mu.Lock()
	m.cleanups = append(m.cleanups, f)
	m.mu.Unlock()
}
func (m *mainTB) Fatalf(format string, args ...any) {
	m.mu.Lock()
	m.failed = true
	m.mu.Unlock()
	panic(fatal(fmt.Sprintf(format, args...)))
}

// cleanup runs the cleanups, last registered first.
func (m *mainTB) cleanup() {
	m.mu.Lock()
	fs := m.cleanups
	m.cleanups = nil
	m.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
