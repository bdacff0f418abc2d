package telemetry_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/telemetry"
)

// recorder is an io.Writer that counts its writes and can be made to fail.
type recorder struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	fail   error
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes++
	if r.fail != nil {
		return 0, r.fail
	}
	return r.buf.Write(p)
}

func (r *recorder) snapshot() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String(), r.writes
}

func TestBufferedWriterKeepsEveryLineInOrderInFewWrites(t *testing.T) {
	t.Parallel()
	var rec recorder
	w := telemetry.NewBufferedWriter(&rec, time.Hour) // only Close flushes
	var want strings.Builder
	for i := range 1000 {
		line := fmt.Sprintf(`{"n":%d}`+"\n", i)
		want.WriteString(line)
		n, err := w.Write([]byte(line))
		require.NoError(t, err)
		require.Equal(t, len(line), n)
	}
	got, writes := rec.snapshot()
	require.Empty(t, got, "nothing written before the interval or Close")
	require.Zero(t, writes)
	require.NoError(t, w.Close())
	got, writes = rec.snapshot()
	require.Equal(t, want.String(), got)
	require.Equal(t, 1, writes, "one write for the whole batch")

	// After Close, writes go straight through.
	_, err := w.Write([]byte("late\n"))
	require.NoError(t, err)
	got, _ = rec.snapshot()
	require.True(t, strings.HasSuffix(got, "late\n"))
}

func TestBufferedWriterFlushesWithinTheInterval(t *testing.T) {
	t.Parallel()
	var rec recorder
	w := telemetry.NewBufferedWriter(&rec, 10*time.Millisecond)
	defer w.Close()
	_, err := w.Write([]byte("one\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { got, _ := rec.snapshot(); return got == "one\n" }, 5*time.Second, 5*time.Millisecond)
	// And again, after the buffer was emptied.
	_, err = w.Write([]byte("two\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { got, _ := rec.snapshot(); return got == "one\ntwo\n" }, 5*time.Second, 5*time.Millisecond)
}

func TestBufferedWriterWritesAFullBufferAtOnce(t *testing.T) {
	t.Parallel()
	var rec recorder
	w := telemetry.NewBufferedWriter(&rec, time.Hour)
	defer w.Close()
	big := bytes.Repeat([]byte("x"), 300<<10)
	_, err := w.Write(big)
	require.NoError(t, err)
	got, writes := rec.snapshot()
	require.Equal(t, 1, writes, "a full buffer does not wait for the interval")
	require.Len(t, got, len(big))
}

func TestBufferedWriterReportsAFailedFlushOnce(t *testing.T) {
	t.Parallel()
	broken := errors.New("disk full")
	rec := recorder{fail: broken}
	w := telemetry.NewBufferedWriter(&rec, 5*time.Millisecond)
	_, err := w.Write([]byte("lost\n"))
	require.NoError(t, err)
	// The flusher's failure comes back on the next Write, once.
	require.Eventually(t, func() bool { _, n := rec.snapshot(); return n == 1 }, 5*time.Second, 2*time.Millisecond)
	_, err = w.Write([]byte("next\n"))
	require.ErrorIs(t, err, broken)
	_, err = w.Write([]byte("next\n"))
	require.NoError(t, err)
	// And a failure at Close is Close's error.
	require.ErrorIs(t, w.Close(), broken)
}
