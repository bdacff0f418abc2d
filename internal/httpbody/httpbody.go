// Package httpbody reads a request body under a size limit, as the api's
// endpoints (the idempotency gateway, the Stripe webhook) refuse one that
// is too large: at once when Content-Length declares it, before any of it
// is read.
package httpbody

import (
	"errors"
	"io"
	"net/http"
)

// ErrTooLarge is returned by Read for a body over the limit, declared by
// Content-Length or found while reading. Callers answer 413.
var ErrTooLarge = errors.New("httpbody: request body too large")

// Read returns r's body, at most max bytes. A body whose Content-Length
// declares more is refused before any of it is read: a client waiting on
// Expect: 100-continue then gets the caller's 413 instead of a 100 Continue
// and a connection reset mid-upload. Its connection is marked to close
// after the answer (Connection: close on w), since the body is never read;
// said outright, that also keeps net/http from first reading the rest of a
// body under 256 KiB before it writes the answer, which held the 413 of a
// client that had sent only part of it until the server's read timeout.
// A body that turns out longer while being read (chunked, or a wrong
// Content-Length) is ErrTooLarge too, and http.MaxBytesReader closes its
// connection the same way.
//
// Any other error is the read's: the client stopped sending (it
// disconnected, or the server's read timeout cut it), which is the
// client's fault, not a server error.
func Read(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if r.ContentLength > max {
		w.Header().Set("Connection", "close")
		return nil, ErrTooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, ErrTooLarge
	}
	return body, err
}
