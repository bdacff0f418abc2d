package telemetry

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
func Serve(addr string, reg *prometheus.Registry, checks ...Check) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", MetricsHandler(reg))
	mux.HandleFunc("GET /healthz", Healthy)
	mux.Handle("GET /readyz", Ready(checks...))
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
