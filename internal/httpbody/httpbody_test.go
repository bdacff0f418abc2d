package httpbody_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/httpbody"
)

// errReader fails like a client that stopped sending.
type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func TestRead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		body          io.Reader
		contentLength int64 // -1: unknown (chunked)
		want          string
		err           error
		closes        bool
	}{
		{"under the limit", strings.NewReader("{}"), 2, "{}", nil, false},
		{"at the limit", strings.NewReader("12345"), 5, "12345", nil, false},
		{"declared over the limit, none of it read", errReader{}, 6, "", httpbody.ErrTooLarge, true},
		{"found over the limit while reading", strings.NewReader("123456"), -1, "", httpbody.ErrTooLarge, false},
		{"the client stopped sending", errReader{}, -1, "", io.ErrUnexpectedEOF, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", c.body)
			r.ContentLength = c.contentLength
			w := httptest.NewRecorder()
			got, err := httpbody.Read(w, r, 5)
			require.True(t, errors.Is(err, c.err), "err %v, want %v", err, c.err)
			require.Equal(t, c.want, string(got))
			require.Equal(t, c.closes, w.Header().Get("Connection") == "close", "Connection: close")
		})
	}
}
