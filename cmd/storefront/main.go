// Command storefront serves a small web shop for one tenant of the
// checkout API (package storefront): products, cart, checkout with the
// Idempotency-Key's panel, 3D Secure through Stripe's redirect, and the
// order page.
//
// Environment (CONTRACT.md, (v3) Clients):
//
//	STOREFRONT_ADDR        listen address, default ":8081"
//	STOREFRONT_TENANT_KEY  the tenant's API key, default sk_test_acme; never sent to the browser
//	API_URL                the checkout API, default http://127.0.0.1:8080
//	STOREFRONT_SESSION_SECRET  signs the session cookies; default derived from
//	                       the tenant key. Keep it across restarts: the API keys
//	                       of the purchases still open depend on the sessions.
//
// A bad value stops it at start with an error naming the variable. It
// serves GET /healthz besides the shop, logs JSON to stdout, and on SIGTERM
// or SIGINT lets requests in flight finish (up to 20s), then the calls to
// the API that Pays started (each bounded by the client's retry policy,
// also when their browser went away), and exits 0.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onceonly/checkout/internal/storefront"
	"github.com/onceonly/checkout/internal/tracing"
)

// shutdownTimeout bounds the drain of requests in flight on shutdown.
const shutdownTimeout = 20 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "storefront:", err)
		os.Exit(1)
	}
}

// run serves until ctx is done, then drains and returns nil.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	logger := slog.New(slog.NewJSONHandler(stdout, nil))
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	addr := env("STOREFRONT_ADDR", ":8081")
	apiURL := env("API_URL", "http://127.0.0.1:8080")
	tenantKey := env("STOREFRONT_TENANT_KEY", "sk_test_acme")
	stopTracing, err := tracing.Setup(ctx, getenv, "checkout-storefront")
	if err != nil {
		return err
	}
	defer tracing.Flush(stopTracing, logger)
	shop, err := storefront.New(storefront.Config{APIURL: apiURL, TenantKey: tenantKey,
		SessionSecret: getenv("STOREFRONT_SESSION_SECRET"), Logger: logger,
		Transport: tracing.HTTPTransport(http.DefaultTransport), TraceUI: getenv("TRACE_UI_URL")})
	if err != nil {
		return fmt.Errorf("API_URL %q: %w", apiURL, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on STOREFRONT_ADDR %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	mux.Handle("/", shop)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	logger.Info("storefront listening", "addr", ln.Addr().String(), "api_url", apiURL)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	// The Pays' calls to the API outlive their requests (a browser that
	// went away): let each end and settle its purchase.
	shop.Wait()
	logger.Info("storefront stopped")
	return nil
}
