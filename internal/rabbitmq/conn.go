// Package rabbitmq holds the broker mechanisms the dispatcher and the worker
// share: a connection that reconnects by itself, the topology declaration, a
// publisher with confirms and a consumer with manual acknowledgements.
//
// amqp091-go never reconnects: a closed connection or channel stays closed.
// Conn redials with exponential backoff whenever a caller asks for a channel
// and the current connection is gone, and Publisher and Consumer watch their
// channel's NotifyClose and ask again, so a broker restart or a cut
// connection heals without a process restart. A queue deleted under a live
// connection heals too: the broker cancels its consumer, which resubscribes,
// and returns what is published to it, which fails; both run Config.Setup
// again first.
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrClosed is returned by Conn methods after Close.
var ErrClosed = errors.New("rabbitmq: connection closed by owner")

// ErrPermanent, wrapped in an error of Config.Prepare or Config.Setup,
// stops the dialing: the broker's state needs an operator (e.g. a classic
// dead-letter queue with messages where a quorum queue is expected), so
// retrying would only hide it. Dial returns the error.
var ErrPermanent = errors.New("rabbitmq: needs an operator")

// nodeName is url's host:port, for logs: never its credentials.
func nodeName(url string) string {
	u, err := amqp.ParseURI(url)
	if err != nil {
		return "?"
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// Config configures a Conn.
type Config struct {
	// URL is an AMQP 0-9-1 URI, e.g. "amqp://guest:guest@127.0.0.1:5672/",
	// or several separated by commas, the nodes of one cluster (see
	// ParseURLs). The Conn connects to the first that answers and, when its
	// connection is lost, tries the nodes after that one first, so that a
	// dead node is tried last.
	URL string
	// Name is sent as the connection_name client property, shown by
	// rabbitmqctl list_connections (optional).
	Name string
	// Setup runs on a fresh channel of every new connection before anyone
	// else uses it, typically DeclareTopology, so that a broker that lost its
	// definitions gets them back. An error fails that connection attempt.
	//
	// A queue can also vanish under a live connection (deleted by an
	// operator or a policy), so Setup runs again without a reconnect: the
	// Consumer runs it at the start of every session (the broker cancels a
	// consumer whose queue is deleted), and the Publisher before its next
	// send after the broker returned a message as unroutable. It must
	// therefore be idempotent and safe to run on a channel already in use.
	Setup func(ch *amqp.Channel) error
	// Prepare, if set, runs on every new connection before Setup, with the
	// connection itself, for work that needs more than one channel: a
	// declare the broker refuses closes its channel (e.g. MigrateDLQ). An
	// error fails that connection attempt, as Setup's does.
	Prepare func(conn *amqp.Connection) error
	// MinBackoff and MaxBackoff bound the wait between dial attempts
	// (defaults 100ms and 5s).
	MinBackoff, MaxBackoff time.Duration
	// DialTimeout bounds one TCP connect and AMQP handshake (default 5s).
	DialTimeout time.Duration
	// Logger receives connection losses and reconnects (default: discard).
	Logger *slog.Logger
}

// Conn is a reconnecting connection to RabbitMQ. It is safe for concurrent
// use. The zero value is not usable; call Dial.
type Conn struct {
	cfg    Config
	logger *slog.Logger

	urls []string // Config.URL split (ParseURLs)

	dialing chan struct{} // a one-slot lock that waits with a context
	next    int           // index in urls tried first by the next dial; guarded by dialing
	mu      sync.Mutex
	conn    *amqp.Connection
	sock    *corkConn // conn's socket
	closed  bool
	wg      sync.WaitGroup // NotifyClose watchers
}

// ParseURLs splits raw, one AMQP URI or several separated by commas (a
// cluster's nodes, e.g.
// "amqp://app:pw@rabbit-0:5672/,amqp://app:pw@rabbit-1:5672/"), and checks
// that each parses. Spaces around a comma are ignored; an empty element is
// an error. The error names the element by position, never its text, which
// may hold a password.
func ParseURLs(raw string) ([]string, error) {
	parts := strings.Split(raw, ",")
	urls := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("url %d of %d is empty", i+1, len(parts))
		}
		if _, err := amqp.ParseURI(p); err != nil {
			return nil, fmt.Errorf("url %d of %d: %w", i+1, len(parts), err)
		}
		urls = append(urls, p)
	}
	return urls, nil
}

// Dial connects to cfg.URL (to one of its nodes), retrying with backoff
// until it succeeds or ctx ends (then it returns ctx's error joined with the
// last dial error). A URL that does not parse fails at once, and so does a
// Prepare or Setup error wrapping ErrPermanent.
func Dial(ctx context.Context, cfg Config) (*Conn, error) {
	urls, err := ParseURLs(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: parse url: %w", err)
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Conn{cfg: cfg, urls: urls, logger: logger, dialing: make(chan struct{}, 1)}
	if _, err := c.connection(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Channel opens a new channel on the current connection, first redialing
// with backoff if the connection is closed. It blocks until it succeeds, ctx
// ends or the Conn is closed (ErrClosed). The caller owns the channel and
// must close it.
func (c *Conn) Channel(ctx context.Context) (*amqp.Channel, error) {
	ch, _, err := c.channel(ctx)
	return ch, err
}

// channel is Channel, also returning the socket of the connection the
// channel was opened on (nil if that connection was replaced meanwhile),
// for the Publisher to cork.
func (c *Conn) channel(ctx context.Context) (*amqp.Channel, *corkConn, error) {
	for {
		conn, err := c.connection(ctx)
		if err != nil {
			return nil, nil, err
		}
		ch, err := conn.Channel()
		if err == nil {
			c.mu.Lock()
			var sock *corkConn
			if c.conn == conn {
				sock = c.sock
			}
			c.mu.Unlock()
			return ch, sock, nil
		}
		// The connection died between the check and the open: dial again.
		c.logger.Warn("rabbitmq: open channel", "err", err)
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
	}
}

// Ping reports whether the broker is reachable: it opens and closes a
// channel, reconnecting if needed, within ctx.
func (c *Conn) Ping(ctx context.Context) error {
	ch, err := c.Channel(ctx)
	if err != nil {
		return err
	}
	return ch.Close()
}

// Close closes the current connection and stops reconnecting; channels opened
// from it are closed with it. Close waits for its watcher goroutines.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closed = true
	conn := c.conn
	c.conn = nil
	c.mu.Unlock()
	var err error
	if conn != nil && !conn.IsClosed() {
		err = conn.Close()
	}
	c.wg.Wait()
	return err
}

// current returns the open connection, or nil.
func (c *Conn) current() (*amqp.Connection, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.conn != nil && !c.conn.IsClosed() {
		return c.conn, nil
	}
	return nil, nil
}

// connection returns the open connection, dialing (one caller at a time,
// the others wait for its result) when there is none.
func (c *Conn) connection(ctx context.Context) (*amqp.Connection, error) {
	if conn, err := c.current(); conn != nil || err != nil {
		return conn, err
	}
	select {
	case c.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.dialing }()
	// Another caller may have dialed while this one waited.
	if conn, err := c.current(); conn != nil || err != nil {
		return conn, err
	}

	b := backoff.NewExponentialBackOff()
	b.InitialInterval = c.cfg.MinBackoff
	b.MaxInterval = c.cfg.MaxBackoff
	attempt := 0
	var lastErr error
	var sock *corkConn
	var node string
	conn, err := backoff.Retry(ctx, func() (*amqp.Connection, error) {
		attempt++
		if c.isClosed() {
			return nil, backoff.Permanent(ErrClosed)
		}
		// One attempt tries every node once, from c.next on: a node that
		// refuses is skipped at once, and the backoff only waits between
		// rounds in which none answered.
		for i := range c.urls {
			idx := (c.next + i) % len(c.urls)
			conn, s, err := c.dial(c.urls[idx])
			if err != nil {
				lastErr = err
				if attempt == 1 || attempt%10 == 0 {
					c.logger.Warn("rabbitmq: dial failed, retrying", "attempt", attempt, "node", nodeName(c.urls[idx]), "err", err)
				}
				if errors.Is(err, ErrPermanent) {
					return nil, backoff.Permanent(err)
				}
				continue
			}
			sock = s
			node = nodeName(c.urls[idx])
			// The next dial, after this connection is lost, starts with the
			// next node: the lost one is probably down.
			c.next = (idx + 1) % len(c.urls)
			return conn, nil
		}
		return nil, lastErr
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
	if err != nil {
		if ctx.Err() != nil && lastErr != nil {
			return nil, fmt.Errorf("rabbitmq: dial: %w (last attempt: %v)", ctx.Err(), lastErr)
		}
		return nil, fmt.Errorf("rabbitmq: dial: %w", err)
	}

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		conn.Close()
		return nil, ErrClosed
	}
	c.conn, c.sock = conn, sock
	c.mu.Unlock()
	c.logger.Info("rabbitmq: connected", "node", node, "attempts", attempt)
	c.watch(conn)
	return conn, nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// dial makes one connection to url, on a socket that can be corked, and
// runs Setup on it.
func (c *Conn) dial(url string) (*amqp.Connection, *corkConn, error) {
	props := amqp.NewConnectionProperties()
	if c.cfg.Name != "" {
		props.SetClientConnectionName(c.cfg.Name)
	}
	var sock *corkConn
	dial := amqp.DefaultDial(c.cfg.DialTimeout)
	conn, err := amqp.DialConfig(url, amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			nc, err := dial(network, addr)
			if err != nil {
				return nil, err
			}
			sock = &corkConn{Conn: nc}
			return sock, nil
		},
	})
	if err != nil {
		return nil, nil, err
	}
	if c.cfg.Prepare != nil {
		if err := c.cfg.Prepare(conn); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("prepare: %w", err)
		}
	}
	if c.cfg.Setup != nil {
		ch, err := conn.Channel()
		if err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("setup channel: %w", err)
		}
		if err := c.cfg.Setup(ch); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("setup: %w", err)
		}
		ch.Close()
	}
	return conn, sock, nil
}

// setup runs Config.Setup, if any, on ch, an open channel of this Conn,
// to declare again what may have been deleted under a live connection.
func (c *Conn) setup(ch *amqp.Channel) error {
	if c.cfg.Setup == nil {
		return nil
	}
	if err := c.cfg.Setup(ch); err != nil {
		return fmt.Errorf("rabbitmq: setup: %w", err)
	}
	return nil
}

// watch logs the connection's end. The NotifyClose channel is closed by
// amqp091 whenever the connection ends, so the goroutine always returns.
func (c *Conn) watch(conn *amqp.Connection) {
	done := conn.NotifyClose(make(chan *amqp.Error, 1))
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err, ok := <-done; ok && err != nil {
			// Nobody redials here: the next Channel call does, with backoff,
			// so a broker that stays down is not hammered by an idle process.
			c.logger.Warn("rabbitmq: connection lost", "err", err)
		}
	}()
}
