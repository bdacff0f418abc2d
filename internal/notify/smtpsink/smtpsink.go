// Package smtpsink is an in-process SMTP server that accepts every message
// and keeps it in memory, for tests and local runs. It can be told to refuse
// the next messages with a reply of choice, or to stop taking connections
// for a while, to exercise a sender's retries; and it can demand TLS
// (STARTTLS or implicit) and a login, as a provider's submission port does.
package smtpsink

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/mail"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Message is one accepted message.
type Message struct {
	// MessageID is the Message-ID header as sent, angle brackets included.
	MessageID string `json:"message_id"`
	// From is the envelope sender (MAIL FROM).
	From string `json:"from"`
	// To are the envelope recipients (RCPT TO).
	To []string `json:"to"`
	// Subject is the Subject header.
	Subject string `json:"subject"`
	// Body is the message body after the headers.
	Body string `json:"body"`
	// Raw is the whole message as received (headers and body).
	Raw string `json:"-"`
	// ReceivedAt is when the DATA command completed.
	ReceivedAt time.Time `json:"received_at"`
	// TLS tells that the message came over TLS.
	TLS bool `json:"tls"`
	// User is the account the client logged in as ("" without AUTH).
	User string `json:"user,omitempty"`
}

// Options make a Sink demand what a mail provider's submission port does.
// The zero value demands nothing.
type Options struct {
	// TLSConfig, when set, offers STARTTLS (RFC 3207) and refuses MAIL on a
	// session still in clear text (530 5.7.0); with ImplicitTLS every
	// connection is TLS from the first byte instead (RFC 8314).
	TLSConfig   *tls.Config
	ImplicitTLS bool
	// Username and Password, when Username is set, are the one account
	// AUTH PLAIN accepts (RFC 4954); a wrong one gets 535 5.7.8, and MAIL
	// before a login 530 5.7.0. Without TLSConfig, AUTH is offered in
	// clear text.
	Username, Password string
}

// Sink is a running SMTP server that records messages. It is safe for
// concurrent use.
type Sink struct {
	addr string // host:port, fixed at Start so that Up listens there again
	opts Options

	mu       sync.Mutex
	server   *smtp.Server  // nil while down
	done     chan struct{} // closed when server's Serve returns
	msgs     []Message
	reject   int // how many of the next messages to refuse
	reply    smtp.SMTPError
	sessions int // SMTP sessions begun
}

// Start listens on addr ("127.0.0.1:0" for a free port) and serves until
// Close.
func Start(addr string) (*Sink, error) { return StartWith(addr, Options{}) }

// StartWith is Start with the demands of opts.
func StartWith(addr string, opts Options) (*Sink, error) {
	s := &Sink{opts: opts}
	ln, err := s.listen(addr)
	if err != nil {
		return nil, err
	}
	s.addr = ln.Addr().String() // before s is shared: Addr reads it unlocked
	return s, nil
}

// listen starts a server on addr and returns its listener; s.mu is held
// or s not yet shared.
func (s *Sink) listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("smtpsink: listen %s: %w", addr, err)
	}
	tcp := ln
	if s.opts.ImplicitTLS {
		ln = tls.NewListener(ln, s.opts.TLSConfig)
	}
	server := smtp.NewServer(s)
	if !s.opts.ImplicitTLS {
		server.TLSConfig = s.opts.TLSConfig // offers STARTTLS
	}
	server.AllowInsecureAuth = s.opts.TLSConfig == nil
	server.Domain = "smtp-sink.local"
	server.ReadTimeout = 30 * time.Second
	server.WriteTimeout = 30 * time.Second
	server.MaxMessageBytes = 1 << 20
	server.EnableSMTPUTF8 = true // RFC 6531 addresses, as Mailpit accepts them
	server.ErrorLog = log.New(io.Discard, "", 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		server.Serve(ln)
	}()
	s.server, s.done = server, done
	return tcp, nil
}

// Addr is the address the sink listens on, host:port.
func (s *Sink) Addr() string { return s.addr }

// Close stops the server and its connections. The messages stay readable.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stop()
}

// stop closes the server, if up, and waits for it; s.mu is held.
func (s *Sink) stop() error {
	if s.server == nil {
		return nil
	}
	err := s.server.Close()
	<-s.done
	s.server, s.done = nil, nil
	if errors.Is(err, smtp.ErrServerClosed) {
		return nil
	}
	return err
}

// Down stops listening and drops the open connections, so that senders
// find the port refusing connections, as when a mail server is down. The
// messages are kept. Up serves again on the same address.
func (s *Sink) Down() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stop()
}

// Up serves again on the address Start took, after Down. It does nothing
// when the sink is up.
func (s *Sink) Up() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.server != nil {
		return nil
	}
	_, err := s.listen(s.addr)
	return err
}

// Messages returns a copy of the messages accepted so far, in order.
func (s *Sink) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

// Len is the number of messages accepted so far.
func (s *Sink) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

// CountByMessageID returns how many messages carried each Message-ID.
func (s *Sink) CountByMessageID() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	counts := make(map[string]int, len(s.msgs))
	for _, m := range s.msgs {
		counts[m.MessageID]++
	}
	return counts
}

// Count is how many messages carried messageID (angle brackets included).
func (s *Sink) Count(messageID string) int {
	return s.CountByMessageID()[messageID]
}

// Reject makes the sink refuse the next n messages at DATA with a
// transient 451, as a full or failing mail server would.
func (s *Sink) Reject(n int) { s.RejectWith(451, n) }

// RejectWith makes the sink refuse the next n messages (0: none) at DATA
// with reply code: a 4xx is temporary ("451 4.3.0"), a 5xx permanent
// ("550 5.7.1", as a relay that refuses the content would answer; RFC 5321,
// 4.2.1). The message is not kept.
func (s *Sink) RejectWith(code, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reject = n
	s.reply = smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCode{code / 100, 3, 0}, Message: "sink told to refuse"}
	if code >= 500 {
		s.reply.EnhancedCode = smtp.EnhancedCode{5, 7, 1}
	}
}

// Outage is the body of PUT /outage: how the sink fails until DELETE
// /outage.
type Outage struct {
	// Mode is "reject" (every message refused at DATA with Code) or
	// "refuse" (connections refused: the SMTP port is closed).
	Mode string `json:"mode"`
	// Code is the reply of mode "reject" (default 451, temporary).
	Code int `json:"code,omitempty"`
}

// Handler serves the sink's HTTP side, for end-to-end tests and manual
// runs:
//
//	GET    /messages  the accepted messages, a JSON array of Message
//	PUT    /outage    start failing as an Outage body says (204)
//	DELETE /outage    serve and accept again (204)
//
// An outage keeps the accepted messages.
func (s *Sink) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /messages", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		msgs := s.Messages()
		if msgs == nil {
			msgs = []Message{}
		}
		json.NewEncoder(w).Encode(msgs)
	})
	mux.HandleFunc("PUT /outage", func(w http.ResponseWriter, r *http.Request) {
		var o Outage
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var err error
		switch o.Mode {
		case "reject":
			if o.Code == 0 {
				o.Code = 451
			}
			if o.Code < 400 || o.Code > 599 {
				http.Error(w, "code must be a 4xx or 5xx reply", http.StatusBadRequest)
				return
			}
			s.RejectWith(o.Code, math.MaxInt)
		case "refuse":
			err = s.Down()
		default:
			http.Error(w, `mode must be "reject" or "refuse"`, http.StatusBadRequest)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /outage", func(w http.ResponseWriter, _ *http.Request) {
		s.Reject(0)
		if err := s.Up(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// Sessions is how many SMTP sessions the sink has begun: one per
// connection, and another after a STARTTLS.
func (s *Sink) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions
}

// NewSession implements smtp.Backend.
func (s *Sink) NewSession(c *smtp.Conn) (smtp.Session, error) {
	s.mu.Lock()
	s.sessions++
	s.mu.Unlock()
	return &session{sink: s, conn: c}, nil
}

// session is one SMTP connection's state.
type session struct {
	sink *Sink
	conn *smtp.Conn
	user string // logged in as
	from string
	to   []string
}

var _ smtp.AuthSession = (*session)(nil)

// AuthMechanisms implements smtp.AuthSession: PLAIN when the sink has an
// account, none (no AUTH offered) otherwise.
func (ss *session) AuthMechanisms() []string {
	if ss.sink.opts.Username == "" {
		return nil
	}
	return []string{sasl.Plain}
}

// Auth implements smtp.AuthSession.
func (ss *session) Auth(mech string) (sasl.Server, error) {
	if mech != sasl.Plain || ss.sink.opts.Username == "" {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	return sasl.NewPlainServer(func(_, username, password string) error {
		if username != ss.sink.opts.Username || password != ss.sink.opts.Password {
			return smtp.ErrAuthFailed // 535 5.7.8
		}
		ss.user = username
		return nil
	}), nil
}

func (ss *session) tls() bool {
	_, ok := ss.conn.TLSConnectionState()
	return ok
}

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	opts := ss.sink.opts
	if opts.TLSConfig != nil && !ss.tls() {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "Must issue a STARTTLS command first"}
	}
	if opts.Username != "" && ss.user == "" {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "Authentication required"}
	}
	ss.from = from
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	ss.to = append(ss.to, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s := ss.sink
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reject > 0 {
		s.reject--
		reply := s.reply
		return &reply
	}
	m := Message{From: ss.from, To: append([]string(nil), ss.to...), Raw: string(raw), ReceivedAt: time.Now(),
		TLS: ss.tls(), User: ss.user}
	if parsed, err := mail.ReadMessage(bytes.NewReader(raw)); err == nil {
		m.MessageID = parsed.Header.Get("Message-ID")
		m.Subject = parsed.Header.Get("Subject")
		body, _ := io.ReadAll(parsed.Body)
		m.Body = string(body)
	}
	s.msgs = append(s.msgs, m)
	return nil
}

func (ss *session) Reset() {
	ss.from, ss.to = "", nil
}

func (ss *session) Logout() error { return nil }
