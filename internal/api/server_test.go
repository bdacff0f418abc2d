package api_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/api"
)

// limitedServer serves h's API behind api.ServerLimits l, counting the
// requests that reached a handler.
func limitedServer(t *testing.T, h *harness, l api.ServerLimits) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var handled atomic.Int64
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		h.api.Handler.ServeHTTP(w, r)
	})
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = l.Server(counting)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &handled
}

// inUse is the number of the API's database connections in use.
func (h *harness) inUse() int {
	h.t.Helper()
	sqlDB, err := h.db.DB()
	require.NoError(h.t, err)
	return sqlDB.Stats().InUse
}

// busyBackends counts the server processes working on the test's database,
// other than the one asking (pg_stat_activity).
func (h *harness) busyBackends() int {
	return h.count(`SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`)
}

// TestSlowHeaderClientIsCut: slowloris clients open connections and dribble
// header bytes forever. None reaches a handler or holds a database
// connection; a normal checkout is served meanwhile on a pool of two
// connections; each slow client is disconnected at the read-header timeout,
// however steadily it keeps sending.
func TestSlowHeaderClientIsCut(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.maxConns = 2 })
	limits := api.DefaultServerLimits
	limits.ReadHeaderTimeout = 1500 * time.Millisecond
	srv, handled := limitedServer(t, h, limits)
	addr := srv.Listener.Addr().String()

	const clients = 20
	type slow struct {
		conn   net.Conn
		cut    chan error // the error that ended the dribble
		opened time.Time
	}
	slows := make([]*slow, clients)
	stop := make(chan struct{})
	defer close(stop)
	for i := range slows {
		// opened is taken before the dial: the server may accept, and start
		// its read-header clock, before the dialing goroutine runs again.
		opened := time.Now()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		s := &slow{conn: conn, cut: make(chan error, 1), opened: opened}
		slows[i] = s
		go func() {
			_, err := fmt.Fprintf(conn, "POST /v1/checkouts HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer sk_test_acme\r\n")
			for n := 0; err == nil; n++ {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				_, err = fmt.Fprintf(conn, "X-Slow-%d: %d\r\n", n, n)
			}
			s.cut <- err
		}()
	}

	// While they dribble: a normal checkout goes through; nothing of the
	// slow clients reached a handler or the database.
	r := postTo(t, srv.URL, "slow-ok", teeBody)
	require.Equal(t, http.StatusCreated, r.StatusCode)
	require.EqualValues(t, 1, handled.Load(), "only the normal checkout reached a handler")
	require.Zero(t, h.inUse(), "no database connection held")
	require.Zero(t, h.busyBackends(), "no database backend busy")

	// Each slow client is cut: its connection reads EOF (or a reset) and its
	// writes fail, at the read-header timeout, not before.
	for i, s := range slows {
		require.NoError(t, s.conn.SetReadDeadline(time.Now().Add(20*time.Second)))
		_, err := io.ReadAll(s.conn)
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "slow client %d still connected after 20s", i)
		require.GreaterOrEqual(t, time.Since(s.opened), limits.ReadHeaderTimeout, "slow client %d cut before the timeout", i)
		select {
		case <-s.cut:
		case <-time.After(20 * time.Second):
			t.Fatalf("slow client %d could still write 20s after being cut", i)
		}
	}
	require.EqualValues(t, 1, handled.Load(), "no slow client ever reached a handler")
	require.Zero(t, h.inUse())
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys`))
}

// TestOversizedHeader: a request whose headers exceed HTTP_MAX_HEADER_BYTES
// gets 431 headers_too_large as a problem, before any handler runs: no key
// is claimed; a request just under the limit is served.
func TestOversizedHeader(t *testing.T) {
	t.Parallel()
	h := setup(t)
	limits := api.DefaultServerLimits
	limits.MaxHeaderBytes = 4 << 10
	srv, handled := limitedServer(t, h, limits)

	req := checkoutRequest(t, srv.URL, "big-header", teeBody)
	req.Header.Set("X-Padding", strings.Repeat("p", limits.MaxHeaderBytes+8192))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var p struct{ Code string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p), "a problem, not net/http's plain text")
	resp.Body.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.Equal(t, "headers_too_large", p.Code)
	require.Zero(t, handled.Load(), "no handler ran")
	require.Zero(t, h.count(`SELECT count(*) FROM idempotency_keys`))

	req = checkoutRequest(t, srv.URL, "big-header", teeBody)
	req.Header.Set("X-Padding", strings.Repeat("p", limits.MaxHeaderBytes-1024))
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the same key, under the limit, executes")
	require.EqualValues(t, 1, handled.Load())
}

// TestSlowBodyIsCut: a client that sends its headers at once and then
// dribbles the body is cut at the read timeout (HTTP_READ_TIMEOUT); the
// gateway answers 400 malformed_json (an incomplete body), not a 500. It
// never held a lease: the same key from a fast client executes meanwhile.
func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	h := setup(t)
	limits := api.DefaultServerLimits
	limits.ReadTimeout = 1500 * time.Millisecond
	limits.ReadHeaderTimeout = time.Second
	srv, _ := limitedServer(t, h, limits)

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /v1/checkouts HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer sk_test_acme\r\n"+
		"Idempotency-Key: slow-body\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", len(teeBody))
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 600; i++ {
			time.Sleep(50 * time.Millisecond)
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	// While the slow client holds its connection, it holds no lease: the
	// gateway takes one only after the whole body is read. The same key
	// from a fast client executes at once.
	fast := postTo(t, srv.URL, "slow-body", teeBody)
	require.Equal(t, http.StatusCreated, fast.StatusCode, "a slow client does not starve its key")

	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "the gateway answers the cut request")
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", b)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.Contains(t, string(b), `"code":"malformed_json"`)
	conn.Close()
	<-done
	require.Equal(t, 1, h.count(`SELECT count(*) FROM idempotency_keys WHERE recovery_point = 'finished'`), "the fast client's key, finished")
	require.Zero(t, h.inUse())
}

func checkoutRequest(t *testing.T, base, key, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/checkouts", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk_test_acme")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	return req
}

func postTo(t *testing.T, base, key, body string) *http.Response {
	t.Helper()
	resp, err := http.DefaultClient.Do(checkoutRequest(t, base, key, body))
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

// TestDeclaredOversizedBodyIsRefusedBeforeItIsSent: a client that declares
// a body over HTTP_MAX_BODY_BYTES gets the 413 problem at once, before it
// has sent the body. One waiting on Expect: 100-continue (curl does above
// 1 MiB) gets no 100 Continue, so it never sends the body: answered after
// the body, the 413 was lost in a connection reset mid-upload. One that
// sends without waiting gets it too, and the connection closes: net/http
// would otherwise read a short body's remainder (under 256 KiB) before
// writing the answer, to keep the connection, which held the 413 until
// the client sent it all or HTTP_READ_TIMEOUT (15s) cut it. Nothing is
// claimed.
func TestDeclaredOversizedBodyIsRefusedBeforeItIsSent(t *testing.T) {
	t.Parallel()
	h := setup(t)
	srv, _ := limitedServer(t, h, api.DefaultServerLimits)
	for _, c := range []struct {
		name, headers, sent string
	}{
		{"expect 100-continue", "Content-Length: 10000000\r\nExpect: 100-continue\r\n", ""},
		{"sending at once", "Content-Length: 100000\r\n", `{"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			fmt.Fprintf(conn, "POST /v1/checkouts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk_test_acme\r\n"+
				"Idempotency-Key: big-declared\r\nContent-Type: application/json\r\n%s\r\n%s", c.headers, c.sent)
			// Well before the server's read timeout (15s), which would
			// also end the wait.
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err, "an answer before the rest of the body")
			defer resp.Body.Close()
			require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "not 100 Continue")
			require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
			require.True(t, resp.Close, "the connection closes: the rest of the body is never read")
			var p struct{ Code string }
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
			require.Equal(t, "payload_too_large", p.Code)
		})
	}
	require.Zero(t, h.count(`SELECT count(*) FROM idempotency_keys`))
}
