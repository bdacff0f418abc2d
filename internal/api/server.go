package api

import (
	"net/http"
	"time"
)

// ServerLimits are the HTTP server's own limits against slow and oversized
// requests (the HTTP_* settings of the README). They act before any handler
// runs: a connection that is cut by one of them never reaches
// authentication, the rate limit, the idempotency gateway or the database.
type ServerLimits struct {
	// MaxHeaderBytes caps the request line and headers (HTTP_MAX_HEADER_BYTES,
	// default 16 KiB). net/http allows some slack on top (4 KiB on a new
	// connection, up to 8 KiB on a reused keep-alive one, for its read
	// buffer) and answers 431 Request Header Fields Too Large beyond that.
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
		Handler:           handler,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
	}
}
