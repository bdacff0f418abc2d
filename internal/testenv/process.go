package testenv

import (
	"bytes"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"
)

// Output is a goroutine-safe io.Writer to pass as a process's stdout (the
// run functions of cmd/*), read by the test while the process runs.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// LogValue waits up to 10s for a JSON log line of out with "msg":msg and a
// string field key, and returns that field's value, e.g. the address a
// process logged with "listening".
func LogValue(t testing.TB, out *Output, msg, key string) string {
	t.Helper()
	re := regexp.MustCompile(`"msg":"` + regexp.QuoteMeta(msg) + `"[^\n]*?"` + regexp.QuoteMeta(key) + `":"([^"]+)"`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: no %q log line with %q in:\n%s", msg, key, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Get fetches url and returns the status and the body.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("testenv: GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("testenv: GET %s: %v", url, err)
	}
	return res.StatusCode, string(b)
}
