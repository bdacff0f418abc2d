package stack

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxies is an in-process toxiproxy server; every dependency link of the
// stack goes through one of its proxies, so a test can cut or stall a
// dependency for one process without touching the shared server behind it.
type Proxies struct {
	server *toxiproxy.ApiServer
}

func newProxies() *Proxies {
	return &Proxies{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.New(io.Discard))}
}

// Add starts a proxy named name on a free local port in front of upstream
// (host:port).
func (ps *Proxies) Add(name, upstream string) (*Proxy, error) {
	p := toxiproxy.NewProxy(ps.server, name, "127.0.0.1:0", upstream)
	if err := ps.server.Collection.Add(p, true); err != nil {
		return nil, fmt.Errorf("toxiproxy %s: %w", name, err)
	}
	return &Proxy{Name: name, p: p}, nil
}

// Close stops every proxy, cutting their connections.
func (ps *Proxies) Close() { _ = ps.server.Collection.Clear() }

// Proxy is one toxiproxy link. Its methods are safe for concurrent use.
type Proxy struct {
	// Name says which process and dependency it links, e.g. "pg-api".
	Name string

	p      *toxiproxy.Proxy
	mu     sync.Mutex
	toxics []string
}

// Addr is the proxy's listening address, host:port, which the process is
// configured with instead of the dependency's.
func (p *Proxy) Addr() string {
	p.p.Lock()
	defer p.p.Unlock()
	return p.p.Listen
}

// Cut closes every connection through the proxy and refuses new ones until
// Restore: the dependency is down for the processes behind this link.
func (p *Proxy) Cut() { p.p.Stop() }

// Restore listens again on the same port after Cut.
func (p *Proxy) Restore() error {
	err := p.p.Start()
	if err == toxiproxy.ErrProxyAlreadyStarted {
		return nil
	}
	return err
}

// Stall keeps the connections open but lets no byte through in either
// direction until Heal, like a hung server or a partition without resets.
// The bytes are held, not dropped (an hour-long latency toxic, which
// toxiproxy flushes when it is removed), as TCP would retransmit them: a
// toxiproxy "timeout" toxic drops them, which leaves a connection whose
// protocol state is broken after the heal.
func (p *Proxy) Stall() error {
	if err := p.addToxic("stall_up", "upstream", "latency", `{"latency":3600000}`); err != nil {
		return err
	}
	return p.addToxic("stall_down", "downstream", "latency", `{"latency":3600000}`)
}

// Latency delays every chunk the dependency sends back by ms milliseconds.
func (p *Proxy) Latency(ms int) error {
	return p.addToxic("latency_down", "downstream", "latency", fmt.Sprintf(`{"latency":%d}`, ms))
}

// Jitter delays every chunk the process sends to the dependency by
// latency±jitter milliseconds, drawn at random per chunk: with a broker,
// publishes reach it late and, across several processes, out of order.
func (p *Proxy) Jitter(latency, jitter int) error {
	return p.addToxic("jitter_up", "upstream", "latency", fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latency, jitter))
}

// DropAnswers lets requests through but resets each connection on the
// first byte of its answer, until Heal: the server has done the work and
// answered, and the client gets no answer (a connection reset), as when a
// load balancer or a NAT drops a connection mid-request.
func (p *Proxy) DropAnswers() error {
	return p.addToxic("drop_answers", "downstream", "reset_peer", `{"timeout":0}`)
}

// Heal removes every toxic (Stall, Latency); it does not undo Cut.
func (p *Proxy) Heal() {
	p.mu.Lock()
	names := p.toxics
	p.toxics = nil
	p.mu.Unlock()
	for _, n := range names {
		_ = p.p.Toxics.RemoveToxic(context.Background(), n)
	}
}

func (p *Proxy) addToxic(name, stream, typ, attrs string) error {
	body := fmt.Sprintf(`{"name":%q,"stream":%q,"type":%q,"toxicity":1,"attributes":%s}`, name, stream, typ, attrs)
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		return fmt.Errorf("toxiproxy %s: add %s: %w", p.Name, name, err)
	}
	p.mu.Lock()
	p.toxics = append(p.toxics, name)
	p.mu.Unlock()
	return nil
}
