// Command stripe-emulator serves the in-memory Stripe PaymentIntents emulator
// (package stripeemu) over HTTP for `make run`, compose and end-to-end tests.
//
// Environment:
//
//	STRIPE_EMULATOR_ADDR        listen address, default ":12111"
//	STRIPE_EMULATOR_KEY_TTL     how long idempotency results are replayed, default 24h
//	STRIPE_EMULATOR_SEARCH_LAG  how long before a new object is searchable, default 2s
//	STRIPE_EMULATOR_WEBHOOK_URL where signed webhook events go, default "" (none)
//	STRIPE_WEBHOOK_SECRET       their signing secret, default whsec_test_checkout
//	STRIPE_EMULATOR_PUBLIC_URL  the address browsers reach it at, for the 3D Secure
//	                            challenge page next_action.redirect_to_url points to;
//	                            default http://127.0.0.1:<the port it listens on>
//
// A bad value stops it at start with an error naming the variable. Besides
// the emulator's routes (see package stripeemu) it serves GET /healthz. It logs JSON to
// stdout and on SIGTERM or SIGINT stops accepting connections, lets requests
// in flight finish (up to 20s) and exits 0.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/onceonly/checkout/internal/stripeemu"
)

// shutdownTimeout bounds the drain of requests in flight on shutdown.
const shutdownTimeout = 20 * time.Second

// defaultSearchLag is STRIPE_EMULATOR_SEARCH_LAG's default: short enough for
// `make run`, long enough that a search right after a create misses, as it
// can at Stripe (https://docs.stripe.com/search#data-freshness).
const defaultSearchLag = 2 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "stripe-emulator:", err)
		os.Exit(1)
	}
}

// run serves until ctx is done, then drains and returns nil; it returns an
// error when it cannot listen or the server fails.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	logger := slog.New(slog.NewJSONHandler(stdout, nil))
	addr := getenv("STRIPE_EMULATOR_ADDR")
	if addr == "" {
		addr = ":12111"
	}

	opts := []stripeemu.Option{stripeemu.WithLogger(logger)}
	keyTTL, err := duration(getenv, "STRIPE_EMULATOR_KEY_TTL", stripeemu.DefaultKeyTTL)
	if err != nil {
		return err
	}
	if keyTTL == 0 {
		return errors.New(`STRIPE_EMULATOR_KEY_TTL "0s": want a positive duration such as 24h`)
	}
	searchLag, err := duration(getenv, "STRIPE_EMULATOR_SEARCH_LAG", defaultSearchLag)
	if err != nil {
		return err
	}
	opts = append(opts, stripeemu.WithKeyTTL(keyTTL), stripeemu.WithSearchLag(searchLag))
	hookURL := getenv("STRIPE_EMULATOR_WEBHOOK_URL")
	if hookURL != "" {
		u, err := url.Parse(hookURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("STRIPE_EMULATOR_WEBHOOK_URL %q: want an absolute http(s) URL", hookURL)
		}
	}
	secret := getenv("STRIPE_WEBHOOK_SECRET")
	if secret == "" {
		secret = stripeemu.DefaultWebhookSecret
	}
	opts = append(opts, stripeemu.WithWebhookURL(hookURL), stripeemu.WithWebhookSecret(secret))
	publicURL := getenv("STRIPE_EMULATOR_PUBLIC_URL")
	if publicURL != "" {
		u, err := url.Parse(publicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("STRIPE_EMULATOR_PUBLIC_URL %q: want an absolute http(s) URL without a path, e.g. http://localhost:12111", publicURL)
		}
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on STRIPE_EMULATOR_ADDR %q: %w", addr, err)
	}
	if publicURL == "" {
		publicURL = fmt.Sprintf("http://127.0.0.1:%d", ln.Addr().(*net.TCPAddr).Port)
	}
	opts = append(opts, stripeemu.WithPublicURL(publicURL))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	emu := stripeemu.New(opts...)
	defer emu.Close()
	mux.Handle("/", emu)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	logger.Info("stripe emulator listening", "addr", ln.Addr().String(), "key_ttl", keyTTL.String(),
		"search_lag", searchLag.String(), "webhook_url", hookURL, "public_url", publicURL)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("stripe emulator shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("stripe emulator stopped")
	return nil
}

// duration reads a positive-or-zero duration variable, def when unset.
func duration(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s %q: want a duration >= 0 such as 24h or 2s", name, v)
	}
	return d, nil
}
