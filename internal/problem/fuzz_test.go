package problem_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/onceonly/checkout/internal/problem"
)

// FuzzWrite renders problems with any status in 400..599, any code, title,
// detail, Retry-After and extension member, plain or wrapped, and holds the
// answer to RFC 9457 and the contract:
//   - the status line is the problem's status, the Content-Type is
//     application/problem+json, and Retry-After is present exactly when
//     positive, in seconds;
//   - the body is one JSON object with "type" (the base URI + code),
//     "title", "status" (the same number as the status line) and "code";
//     "detail" exactly when non-empty; the extension member unless its name
//     is one of those five;
//   - strings come back as they were when they are valid UTF-8, and as
//     valid UTF-8 when they were not;
//   - an error that is not a problem becomes the generic 500 and says
//     nothing of its own text.
func FuzzWrite(f *testing.F) {
	// The integers are small types on purpose: go test's minimizer shrinks
	// an integer one by one, which for an int can outlast the fuzz run.
	f.Add(uint8(9), "idempotency_key_in_use", "Idempotency-Key in use", "Retry later.", uint16(101), "order_id", "ord_1", false)
	f.Add(uint8(0), "validation_error", "Invalid request", "", uint16(100), "errors", `[{"field":"email"}]`, true)
	f.Add(uint8(2), "card_declined", "Card declined", "Declined.", uint16(0), "status", "999", false)
	f.Add(uint8(29), "rate_limited", "Too many requests", "Slow down.", uint16(103), "type", "https://evil.example/", false)
	f.Add(uint8(100), "", "", "", uint16(95), "", "", true)
	f.Add(uint8(103), "unavailable", "\xff\xfe", "<script>&\u2028", uint16(65535), "detail", "\x00", false)
	f.Fuzz(func(t *testing.T, statusOffset uint8, code, title, detail string, retry uint16, extName, extValue string, wrap bool) {
		status := 400 + int(statusOffset)%200 // 400..599
		retryAfter := int(retry) - 100        // -100..65435: zero and negatives mean no header
		p := &problem.Problem{Status: status, Code: code, Title: title, Detail: detail, RetryAfter: retryAfter}
		// Extension names are the service's own (order_id, errors), never
		// the client's: only valid UTF-8 names are tried.
		if extName != "" && utf8.ValidString(extName) {
			p = p.With(extName, extValue)
		}
		var err error = p
		if wrap {
			err = fmt.Errorf("cause: %s: %w", detail, p)
		}
		w := httptest.NewRecorder()
		if known := problem.Write(w, err); !known {
			t.Fatalf("a problem reported as unknown")
		}
		checkRendered(t, w, p)

		// Anything that is not a problem is the generic 500, whatever it says.
		w = httptest.NewRecorder()
		if problem.Write(w, errors.New(detail)) {
			t.Fatalf("a plain error reported as known")
		}
		checkRendered(t, w, problem.Internal)
	})
}

func checkRendered(t *testing.T, w *httptest.ResponseRecorder, p *problem.Problem) {
	t.Helper()
	if w.Code != p.Status {
		t.Fatalf("status %d, want %d", w.Code, p.Status)
	}
	if ct := w.Header().Values("Content-Type"); len(ct) != 1 || ct[0] != "application/problem+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	if got, want := w.Header().Values("Retry-After"), p.RetryAfter; want > 0 && (len(got) != 1 || got[0] != strconv.Itoa(want)) || want <= 0 && len(got) != 0 {
		t.Fatalf("Retry-After %q for RetryAfter %d", got, want)
	}
	body := w.Body.Bytes()
	if !utf8.Valid(body) {
		t.Fatalf("body is not UTF-8: %q", body)
	}
	var m map[string]any
	dec := json.NewDecoder(w.Body)
	if err := dec.Decode(&m); err != nil || dec.More() {
		t.Fatalf("body %q is not one JSON object: %v", body, err)
	}
	want := map[string]any{
		"type":   "https://checkout.local/problems/" + p.Code,
		"title":  p.Title,
		"status": float64(p.Status),
		"code":   p.Code,
	}
	if p.Detail != "" {
		want["detail"] = p.Detail
	}
	for k, v := range p.Extensions {
		if _, reserved := want[k]; !reserved {
			want[k] = v
		}
	}
	if len(m) != len(want) {
		t.Fatalf("members %v, want %v", m, want)
	}
	for k, v := range want {
		got, ok := m[k]
		if !ok {
			t.Fatalf("member %q missing from %s", k, body)
		}
		s, isString := v.(string)
		switch {
		case isString && utf8.ValidString(s):
			if got != s {
				t.Fatalf("member %q = %q, want %q", k, got, s)
			}
		case isString:
			if gs, ok := got.(string); !ok || !utf8.ValidString(gs) {
				t.Fatalf("member %q = %q, want a valid UTF-8 string", k, got)
			}
		case got != v:
			t.Fatalf("member %q = %v, want %v", k, got, v)
		}
	}
}
