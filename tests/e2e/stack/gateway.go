package stack

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"
)

// Gateway is a reverse proxy in front of the API that behaves like a load
// balancer: a request the API has not answered within Timeout gets a 504,
// while the API, which is not told, goes on with it. That is the "504 after
// commit" every client of a payment API eventually sees.
type Gateway struct {
	// URL is the gateway's base URL, http://127.0.0.1:port.
	URL string

	srv      *http.Server
	timeout  atomic.Int64 // nanoseconds
	timeouts atomic.Int64
}

func newGateway(upstream string, timeout time.Duration) (*Gateway, error) {
	target, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &Gateway{URL: "http://" + ln.Addr().String()}
	g.timeout.Store(int64(timeout))
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		status := http.StatusBadGateway
		if errors.Is(err, context.DeadlineExceeded) {
			status = http.StatusGatewayTimeout
			g.timeouts.Add(1)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(http.StatusText(status) + "\n"))
	}
	g.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), time.Duration(g.timeout.Load()))
			defer cancel()
			rp.ServeHTTP(w, r.WithContext(ctx))
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = g.srv.Serve(ln) }()
	return g, nil
}

// SetTimeout changes how long the gateway waits for the API.
func (g *Gateway) SetTimeout(d time.Duration) { g.timeout.Store(int64(d)) }

// Timeouts is how many 504s the gateway has answered.
func (g *Gateway) Timeouts() int { return int(g.timeouts.Load()) }

func (g *Gateway) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
	_ = g.srv.Close()
}
