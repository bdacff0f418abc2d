package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"
)

// apiLine is one line of the api's JSON log: the fields the tests read.
type apiLine struct{ Msg, Addr string }

// runAPI calls run(ctx, vars) on a goroutine of its own. The api's log
// lines arrive on lines as it writes them (up to 1024 unread; more are
// dropped rather than block the api's log); run's result arrives on done,
// which has room for one more, so a test that took it early can put it
// back for a cleanup that waits for it.
func runAPI(ctx context.Context, vars map[string]string) (lines <-chan apiLine, done chan error) {
	pr, pw := io.Pipe()
	done = make(chan error, 1)
	go func() {
		done <- run(ctx, env(vars), pw)
		pw.Close()
	}()
	out := make(chan apiLine, 1024)
	go func() {
		defer close(out)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line apiLine
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			select {
			case out <- line:
			default:
			}
		}
	}()
	return out, done
}

// waitForLog reads lines until one says msg and returns its Addr. It fails
// the test when run returns first (putting its result back on done), when
// the log ends, or after 30s.
func waitForLog(t *testing.T, lines <-chan apiLine, done chan error, msg string) string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("the api's log ended before %q", msg)
			}
			if line.Msg == msg {
				return line.Addr
			}
		case err := <-done:
			done <- err // for a cleanup that waits for it
			t.Fatalf("run returned before logging %q: %v", msg, err)
		case <-deadline:
			t.Fatalf("no %q in the api's log after 30s", msg)
		}
	}
}
