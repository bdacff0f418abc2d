package rabbitmq

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeSocket records writes and can be made to fail them.
type fakeSocket struct {
	net.Conn // nil: only Write and Close are called
	mu       sync.Mutex
	writes   [][]byte
	fail     error
	closed   bool
}

func (s *fakeSocket) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	s.writes = append(s.writes, append([]byte(nil), p...))
	return len(p), nil
}

func (s *fakeSocket) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func TestCorkedSocketSendsABatchInOneWrite(t *testing.T) {
	t.Parallel()
	s := &fakeSocket{}
	c := &corkConn{Conn: s}
	_, err := c.Write([]byte("a"))
	require.NoError(t, err)
	require.Len(t, s.writes, 1, "uncorked: written at once")

	c.cork()
	for _, p := range []string{"b", "c", "d"} {
		n, err := c.Write([]byte(p))
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	require.Len(t, s.writes, 1, "corked: gathered")
	require.NoError(t, c.uncork())
	require.Equal(t, [][]byte{[]byte("a"), []byte("bcd")}, s.writes)

	// A corked batch larger than corkMax goes out as it grows.
	c.cork()
	big := bytes.Repeat([]byte("x"), corkMax/4)
	for range 5 {
		_, err := c.Write(big)
		require.NoError(t, err)
	}
	require.Len(t, s.writes, 3, "written once past corkMax")
	require.NoError(t, c.uncork())
	require.Len(t, s.writes, 4)
	require.Len(t, s.writes[2], corkMax)
	require.Len(t, s.writes[3], corkMax/4)
}

// A gathered write that fails closes the socket (amqp091 then ends the
// connection, failing the unconfirmed messages) and every later write
// fails: nothing gathered is ever taken for sent.
func TestCorkedSocketWhoseWriteFailsIsClosed(t *testing.T) {
	t.Parallel()
	cut := errors.New("connection reset")
	s := &fakeSocket{}
	c := &corkConn{Conn: s}
	c.cork()
	_, err := c.Write([]byte("msg"))
	require.NoError(t, err)
	s.fail = cut
	require.ErrorIs(t, c.uncork(), cut)
	require.True(t, s.closed)
	s.fail = nil
	_, err = c.Write([]byte("later"))
	require.ErrorIs(t, err, cut)
	require.Empty(t, s.writes)
}

// The batch gathered by a Send whose final write fails is reported failed
// at once, with that write's error, not left to wait for confirms.
func TestSendWhoseBatchCannotBeWrittenFailsEveryMessage(t *testing.T) {
	t.Parallel()
	url := os.Getenv("TEST_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := Dial(context.Background(), Config{URL: url})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	// The default exchange, to no queue: returned, on a channel that stays
	// open, which is all this first publish is for.
	p := NewPublisher(conn, PublisherConfig{Exchange: "", ConfirmTimeout: 5 * time.Second})
	t.Cleanup(func() { p.Close() })
	msg := Message{MessageID: "m", RoutingKey: "no.such.queue." + t.Name(), Body: []byte("{}")}
	errs := p.Publish(context.Background(), []Message{msg})
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], ErrUnroutable)

	cut := errors.New("connection reset")
	p.mu.Lock()
	sock := p.ch.sock
	p.mu.Unlock()
	require.NotNil(t, sock)
	sock.mu.Lock()
	sock.failFlush = cut
	sock.mu.Unlock()
	for i, err := range p.Publish(context.Background(), []Message{msg, msg, msg}) {
		require.ErrorIs(t, err, cut, "message %d: the write's own error, at once", i)
	}
}
