// Command smtp-sink is a local SMTP server that accepts every message and
// shows what it received: SMTP on SMTP_SINK_ADDR (127.0.0.1:1025), and
// GET /messages (JSON) on SMTP_SINK_HTTP_ADDR (127.0.0.1:8025). It is for
// end-to-end tests and `make demo`; use Mailpit for a mail UI.
//
// To try the worker's SMTP_TLS and login against it: SMTP_SINK_TLS
// (none, starttls or tls) serves a self-signed certificate made at start
// and written, in PEM, to SMTP_SINK_CERT_FILE (the worker's
// SMTP_TLS_CA_FILE); SMTP_SINK_USERNAME and SMTP_SINK_PASSWORD are the one
// account it then demands.
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

	"github.com/onceonly/checkout/internal/notify/smtpsink"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "smtp-sink:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	smtpAddr := or(getenv("SMTP_SINK_ADDR"), "127.0.0.1:1025")
	httpAddr := or(getenv("SMTP_SINK_HTTP_ADDR"), "127.0.0.1:8025")
	logger := slog.New(slog.NewJSONHandler(stdout, nil))

	opts, err := options(getenv)
	if err != nil {
		return err
	}
	sink, err := smtpsink.StartWith(smtpAddr, opts)
	if err != nil {
		return err
	}
	defer sink.Close()
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", httpAddr, err)
	}
	srv := &http.Server{Handler: sink.Handler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("smtp-sink listening", "smtp", sink.Addr(), "http", ln.Addr().String(),
		"tls", or(getenv("SMTP_SINK_TLS"), "none"), "username", opts.Username)

	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("smtp-sink stopped", "messages", sink.Len())
	return nil
}

// options reads the TLS and login the sink demands.
func options(getenv func(string) string) (smtpsink.Options, error) {
	opts := smtpsink.Options{Username: getenv("SMTP_SINK_USERNAME"), Password: getenv("SMTP_SINK_PASSWORD")}
	mode := or(getenv("SMTP_SINK_TLS"), "none")
	switch mode {
	case "none":
		return opts, nil
	case "starttls", "tls":
	default:
		return opts, fmt.Errorf("SMTP_SINK_TLS: %q is not one of none, starttls, tls", mode)
	}
	certFile := getenv("SMTP_SINK_CERT_FILE")
	if certFile == "" {
		return opts, errors.New("SMTP_SINK_CERT_FILE: required with SMTP_SINK_TLS: where to write the certificate clients must trust")
	}
	cfg, certPEM, err := smtpsink.SelfSigned()
	if err != nil {
		return opts, err
	}
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return opts, fmt.Errorf("SMTP_SINK_CERT_FILE: %w", err)
	}
	opts.TLSConfig, opts.ImplicitTLS = cfg, mode == "tls"
	return opts, nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
