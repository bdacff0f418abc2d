package rabbitmq

import (
	"net"
	"sync"
)

// corkMax is how much a corked socket gathers before it writes anyway.
const corkMax = 64 << 10

// corkConn is a broker connection's socket that can gather writes: between
// cork and uncork, what amqp091 writes (one write system call per
// published message, each waking the broker for a read) is kept and sent
// in one write per 64 KiB instead. The Publisher corks the socket while
// it sends a batch; every other write goes through at once.
//
// A gathered write that fails closes the socket, so that amqp091's reader
// fails and ends the connection: the frames it believed sent are then
// resolved as the channel's failure (the Publisher reports them unconfirmed
// and the relay publishes them again), never as sent.
type corkConn struct {
	net.Conn

	mu     sync.Mutex
	corked bool
	buf    []byte
	err    error // a gathered write failed: the socket is closed

	// failFlush, set by tests (under mu), fails the next gathered write.
	failFlush error
}

// Write writes p, or gathers it while the socket is corked.
func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.corked {
		return c.Conn.Write(p)
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) >= corkMax {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// cork starts gathering writes.
func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork writes what was gathered and stops gathering.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.flushLocked()
}

// flushLocked writes the gathered bytes; c.mu must be held.
func (c *corkConn) flushLocked() error {
	if len(c.buf) == 0 {
		return nil
	}
	err := c.failFlush
	if err == nil {
		_, err = c.Conn.Write(c.buf)
	}
	c.buf = c.buf[:0]
	if err != nil {
		c.err = err
		c.Conn.Close()
	}
	return err
}
