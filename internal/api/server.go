package api

import (
	"net/http"
	"time"

	"github.com/onceonly/checkout/internal/problem"
)

// ServerLimits are the HTTP server's own limits against slow and oversized
// requests (the HTTP_* settings of the README). They act before any handler
// runs: a connection that is cut by one of them never reaches
// authentication, the rate limit, the idempotency gateway or the database.
type ServerLimits struct {
	// MaxHeaderBytes caps the request line and headers (HTTP_MAX_HEADER_BYTES,
	// default 16 KiB): a request over it is answered 431
	// headers_too_large, a problem like every other error, before any other
	// handler. net/http itself reads up to headerSlack more (and answers a
	// plain-text 431 beyond that, with no handler to write a problem).
	MaxHeaderBytes int
	// ReadHeaderTimeout is how long a client may take to send its request
	// line and headers, from its first byte (HTTP_READ_HEADER_TIMEOUT,
	// default 5s): a slow-header client (slowloris) is disconnected then.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading the whole request, body included
	// (HTTP_READ_TIMEOUT, default 15s).
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its headers to the end
	// of its response (HTTP_WRITE_TIMEOUT, default 75s). It must exceed
	// WORK_TIMEOUT, or a slow checkout loses its answer (its work, detached
	// from the connection, still finishes and is replayed to the retry).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection with no request for that
	// long (HTTP_IDLE_TIMEOUT, default 60s).
	IdleTimeout time.Duration
}

// DefaultServerLimits are the defaults of the HTTP_* settings.
var DefaultServerLimits = ServerLimits{
	MaxHeaderBytes:    16 << 10,
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       15 * time.Second,
	WriteTimeout:      75 * time.Second,
	IdleTimeout:       60 * time.Second,
}

// Server returns an http.Server for handler with the limits l.
func (l ServerLimits) Server(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           limitHeaders(l.MaxHeaderBytes, handler),
		MaxHeaderBytes:    l.MaxHeaderBytes + headerSlack,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
	}
}

// headerSlack is how far past MaxHeaderBytes net/http reads a request's
// headers, so that limitHeaders, not net/http's plain-text answer, refuses
// them (the contract: every error is a problem).
const headerSlack = 64 << 10

// ErrHeadersTooLarge is the 431 of a request whose request line and headers
// exceed ServerLimits.MaxHeaderBytes.
var ErrHeadersTooLarge = problem.New(problem.CodeHeadersTooLarge,
	"The request line and headers exceed the server's limit (HTTP_MAX_HEADER_BYTES).")

// limitHeaders answers ErrHeadersTooLarge, without calling next, for a
// request whose request line and headers, counted as they are sent
// ("Name: value\r\n" each), exceed max bytes.
func limitHeaders(max int, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4
		for k, vs := range r.Header {
			for _, v := range vs {
				n += len(k) + len(v) + 4
			}
		}
		if n > max {
			w.Header().Set("Connection", "close")
			problem.Write(w, ErrHeadersTooLarge)
			return
		}
		next.ServeHTTP(w, r)
	})
}
