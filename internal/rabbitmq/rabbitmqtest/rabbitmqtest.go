// Package rabbitmqtest gives tests their own copy of the checkout topology
// on the shared RabbitMQ, and a TCP proxy that can cut every connection
// through it to simulate a broker or network failure.
package rabbitmqtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/checkout/internal/rabbitmq"
)

// URL is the broker tests use: $TEST_AMQP_URL, or the machine's local
// RabbitMQ with the guest account.
func URL() string {
	if u := os.Getenv("TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// NewNames declares a copy of the topology whose names start with
// "test.<random>.", and deletes it (with its messages) in t.Cleanup.
func NewNames(t testing.TB) rabbitmq.Names {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	names := rabbitmq.DefaultNames().WithPrefix("test." + hex.EncodeToString(b) + ".")

	conn := Dial(t, URL())
	ch, err := conn.Channel(context.Background())
	if err != nil {
		t.Fatalf("rabbitmqtest: channel: %v", err)
	}
	defer ch.Close()
	if err := rabbitmq.DeclareTopology(ch, names); err != nil {
		t.Fatalf("rabbitmqtest: declare: %v", err)
	}
	t.Cleanup(func() {
		c, err := rabbitmq.Dial(context.Background(), rabbitmq.Config{URL: URL()})
		if err != nil {
			t.Logf("rabbitmqtest: cleanup dial: %v", err)
			return
		}
		defer c.Close()
		ch, err := c.Channel(context.Background())
		if err != nil {
			t.Logf("rabbitmqtest: cleanup channel: %v", err)
			return
		}
		if err := rabbitmq.DeleteTopology(ch, names); err != nil {
			t.Logf("rabbitmqtest: cleanup: %v", err)
		}
	})
	return names
}

// Dial connects to url (give up after 10s) and closes the Conn in t.Cleanup.
func Dial(t testing.TB, url string, setup ...func(*rabbitmq.Config)) *rabbitmq.Conn {
	t.Helper()
	cfg := rabbitmq.Config{URL: url, Name: t.Name(), MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}
	for _, s := range setup {
		s(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("rabbitmqtest: dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Proxy forwards TCP connections from a local port to a target address and
// can cut all of them at once, like a broker restart or a network failure
// seen from the client.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup

	blackhole atomic.Bool
}

// NewProxy listens on 127.0.0.1:0 and forwards to target (host:port). It is
// closed in t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("rabbitmqtest: proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// CutAll closes every connection through the proxy, both sides, and
// returns how many client connections it cut. New connections are accepted
// as before.
func (p *Proxy) CutAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	n := len(p.conns) / 2
	clear(p.conns)
	return n
}

// Close stops accepting, cuts every connection and waits for the copiers.
func (p *Proxy) Close() {
	p.ln.Close()
	p.CutAll()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client] = struct{}{}
		p.conns[server] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(client, server, &p.blackhole)
		go p.pipe(server, client, nil)
	}
}

// Blackhole, while on, drops every byte the target sends to clients, as a
// network that silently loses packets: the clients' writes still succeed, but
// no answer (confirm, delivery, heartbeat) arrives.
func (p *Proxy) Blackhole(on bool) { p.blackhole.Store(on) }

func (p *Proxy) pipe(dst, src net.Conn, drop *atomic.Bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && (drop == nil || !drop.Load()) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Ready returns how many messages wait in queue on the broker at url,
// unacked ones excluded, by a passive declare on a connection of its own;
// an error when the broker cannot be reached or the queue does not exist.
func Ready(url, queue string) (int, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return q.Messages, err
}
