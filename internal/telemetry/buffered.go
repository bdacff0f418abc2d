package telemetry

import (
	"io"
	"sync"
	"time"
)

// maxBuffered is how much a BufferedWriter holds before a Write writes it
// out itself instead of leaving it to the flusher.
const maxBuffered = 256 << 10

// BufferedWriter batches the records written to it (the logs) into few
// writes to the underlying writer: a Write copies its bytes and returns,
// and what accumulated goes out in one write at most Interval after the
// first of it, or at once when the buffer holds 256 KiB. Under load a
// process that logs every request then makes one write system call per
// Interval instead of one per request. Bytes reach the writer whole and in
// the order they were written. The cost: a process killed without Close
// loses at most Interval of its last records.
//
// BufferedWriter is safe for concurrent use. Close flushes and stops its
// goroutine; writes after Close go straight to the underlying writer.
type BufferedWriter struct {
	w        io.Writer
	interval time.Duration

	mu       sync.Mutex
	buf      []byte
	err      error // the first failed write, returned by the next Write and by Close
	closed   bool
	stopOnce sync.Once
	pending  chan struct{} // signals the flusher that buf is no longer empty
	done     chan struct{}
	stopped  chan struct{}
}

// NewBufferedWriter returns a BufferedWriter to w that flushes interval
// after the first unflushed byte, and starts its flusher; call Close.
func NewBufferedWriter(w io.Writer, interval time.Duration) *BufferedWriter {
	b := &BufferedWriter{w: w, interval: interval, pending: make(chan struct{}, 1),
		done: make(chan struct{}), stopped: make(chan struct{})}
	go b.flusher()
	return b
}

// Write buffers p (or, after Close, writes it through). It returns the
// error of an earlier failed flush, if any, once.
func (b *BufferedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.w.Write(p)
	}
	if err := b.err; err != nil {
		b.err = nil
		return 0, err
	}
	wasEmpty := len(b.buf) == 0
	b.buf = append(b.buf, p...)
	if len(b.buf) >= maxBuffered {
		// Too much to hold: write it now, on the caller's time.
		return len(p), b.flushLocked()
	}
	if wasEmpty {
		select {
		case b.pending <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// Close writes out what is buffered, stops the flusher and returns the
// first write error not yet returned.
func (b *BufferedWriter) Close() error {
	// The flusher stops first and the writer is marked closed only in the
	// same critical section as the last flush: a Write racing with Close is
	// either buffered (and flushed here, in order) or written after it,
	// never ahead of bytes still buffered.
	b.stopOnce.Do(func() { close(b.done) })
	<-b.stopped
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	ferr := b.flushLocked()
	err := b.err
	b.err = nil
	if err == nil {
		err = ferr
	}
	return err
}

// flusher writes the buffer out Interval after it stopped being empty.
func (b *BufferedWriter) flusher() {
	defer close(b.stopped)
	timer := time.NewTimer(b.interval)
	timer.Stop()
	for {
		select {
		case <-b.done:
			timer.Stop()
			return
		case <-b.pending:
			timer.Reset(b.interval)
		}
		select {
		case <-b.done:
			timer.Stop()
			return
		case <-timer.C:
		}
		b.mu.Lock()
		if err := b.flushLocked(); err != nil && b.err == nil {
			b.err = err // nobody waits for this write: report it on the next one
		}
		b.mu.Unlock()
	}
}

// flushLocked writes the buffer out; b.mu must be held. On a failure the
// bytes are dropped: a log that cannot be written is not retried forever.
func (b *BufferedWriter) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}
