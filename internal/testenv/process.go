package testenv

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"
)

// Output is a goroutine-safe io.Writer for logs: a process's stdout (the
// run functions of cmd/*) or a logger's, read by the test while it runs.
// With TEST_LOG_STDERR set, everything is also copied to stderr as it comes.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if os.Getenv("TEST_LOG_STDERR") != "" {
		os.Stderr.Write(p)
	}
	return o.b.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Clock is a settable test clock: real time plus an offset, so that lease
// and TTL tests move time forward instead of sleeping. Its Now is the
// func() time.Time the stores take.
type Clock struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now returns the real time plus the offset.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
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
