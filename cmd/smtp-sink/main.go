// Command smtp-sink is a local SMTP server that accepts every message and
// shows what it received: SMTP on SMTP_SINK_ADDR (127.0.0.1:1025), and
// GET /messages (JSON) on SMTP_SINK_HTTP_ADDR (127.0.0.1:8025). It is for
// end-to-end tests and `make demo`; use Mailpit for a mail UI.
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

	sink, err := smtpsink.Start(smtpAddr)
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
	logger.Info("smtp-sink listening", "smtp", sink.Addr(), "http", ln.Addr().String())

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

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
