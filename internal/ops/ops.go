// Package ops holds what the background processes (dispatcher, worker)
// share around their loops: waiting for their dependencies at start, the
// /metrics, /healthz and /readyz server, and running loops until a drain.
package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/telemetry"
)

// Server is the running ops HTTP server.
type Server struct {
	srv  *http.Server
	addr string
	done chan error
}

// Serve starts the ops server on addr: GET /metrics (reg in the Prometheus
// text format), /healthz (200 while the process runs) and /readyz (200 when
// every check passes, else 503 naming the failing dependencies). It returns
// an error if addr cannot be listened on.
func Serve(addr string, reg *prometheus.Registry, checks ...telemetry.Check) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", telemetry.MetricsHandler(reg))
	mux.HandleFunc("GET /healthz", telemetry.Healthy)
	mux.Handle("GET /readyz", telemetry.Ready(checks...))
	s := &Server{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		addr: ln.Addr().String(),
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on, host:port.
func (s *Server) Addr() string { return s.addr }

// Shutdown stops the server, letting requests in flight finish within ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// OpenDB opens the database, retrying with backoff (up to 5s apart) until it
// answers or ctx ends. Validate the URL first: a malformed one is retried
// like an unreachable server.
func OpenDB(ctx context.Context, cfg postgres.Config, logger *slog.Logger) (*gorm.DB, error) {
	b := backoff.NewExponentialBackOff()
	b.MaxInterval = 5 * time.Second
	attempt := 0
	return backoff.Retry(ctx, func() (*gorm.DB, error) {
		attempt++
		db, err := postgres.Open(ctx, cfg)
		if err != nil {
			logger.Warn("postgres not reachable, retrying", "attempt", attempt, "err", err)
		}
		return db, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
}

// SchemaReady reports an error naming the first of tables that does not
// exist yet. The API applies the migrations; the background processes only
// wait for them.
func SchemaReady(ctx context.Context, db *gorm.DB, tables ...string) error {
	for _, t := range tables {
		var exists bool
		if err := db.WithContext(ctx).Raw(`SELECT to_regclass(?) IS NOT NULL`, "public."+t).Scan(&exists).Error; err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("table %s does not exist yet (migrate, or the api at start, applies the migrations)", t)
		}
	}
	return nil
}

// WaitForSchema polls SchemaReady every second until it passes or ctx ends.
func WaitForSchema(ctx context.Context, db *gorm.DB, logger *slog.Logger, tables ...string) error {
	logged := false
	for {
		err := SchemaReady(ctx, db, tables...)
		if err == nil {
			return nil
		}
		if !logged {
			logger.Warn("waiting for the schema", "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for schema: %w (%v)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

// Loop is a background loop: it runs until ctx ends, finishes its work in
// flight, and returns nil, or returns an error if it cannot go on.
type Loop func(ctx context.Context) error

// RunLoops runs every loop until ctx ends or one returns an error (which
// stops the others), then waits up to drain for all of them to return. It
// returns the first loop error. A drain that takes longer is logged and
// abandoned: the durable state (outbox rows, notification claims) lets
// another process finish that work.
func RunLoops(ctx context.Context, drain time.Duration, logger *slog.Logger, loops ...Loop) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, l := range loops {
		g.Go(func() error { return l(gctx) })
	}
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		return err
	case <-gctx.Done():
	}
	logger.Info("draining", "timeout", drain.String())
	select {
	case err := <-done:
		return err
	case <-time.After(drain):
		logger.Error("drain timed out; work in flight is left to the durable state", "timeout", drain.String())
		return nil
	}
}
