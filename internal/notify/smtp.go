package notify

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"golang.org/x/net/idna"
)

// Email is one plain-text email.
type Email struct {
	// MessageID is the Message-ID header, angle brackets included.
	MessageID string
	// From and To are bare addresses, used for the envelope and the headers.
	From, To string
	// Subject is a single line.
	Subject string
	// Body is plain text with "\n" line ends.
	Body string
}

// Mailer delivers emails. Send returns nil once the server has accepted the
// message (SMTP 250 after DATA), and an error otherwise, in which case the
// message may or may not have been delivered. An error that wraps
// ErrRejected is the server's permanent refusal of this message: sending it
// again cannot succeed. Any other error is temporary (a 4xx reply, a
// refused, dropped or timed-out connection, a failed login or TLS
// handshake) and worth retrying.
type Mailer interface {
	Send(ctx context.Context, e Email) error
}

// ErrRejected marks a Send error that is the mail server's permanent
// refusal of the message: a 5xx reply to MAIL, RCPT or DATA (RFC 5321,
// 4.2.1: "the SMTP client SHOULD NOT repeat the exact request"). Match it
// with errors.Is; the error also wraps go-smtp's *smtp.SMTPError.
//
// Some 5xx replies are not about the message and stay temporary: a 5xx
// before the transaction (at the greeting, EHLO, STARTTLS or AUTH, such as
// 535 for a wrong password), a reply that the session must log in or start
// TLS first (530, 538, or 5.7.0 at MAIL: RFC 4954, 6), and 552 to RCPT,
// which RFC 5321 (4.5.3.1.10) tells clients to treat as the temporary 452.
// Those are the configuration's or the server's to fix, and the email goes
// once they are fixed.
var ErrRejected = errors.New("smtp: message rejected")

// Stages of a transaction whose failure rejected reports about.
const (
	stageMail = "mail"
	stageRcpt = "rcpt"
	stageData = "data"
)

// rejected wraps err with ErrRejected when it is a permanent refusal of
// the message at stage (see ErrRejected), and returns it as it is
// otherwise.
func rejected(stage string, err error) error {
	var reply *smtp.SMTPError
	if !errors.As(err, &reply) || reply.Code < 500 || reply.Code > 599 {
		return err
	}
	switch {
	case reply.Code == 530 || reply.Code == 538:
		return err // authentication or encryption required (RFC 4954, 6)
	case stage == stageMail && reply.EnhancedCode == smtp.EnhancedCode{5, 7, 0}:
		return err // go-smtp's "Please authenticate first" (502 5.7.0)
	case stage == stageRcpt && reply.Code == 552:
		return err // RFC 5321, 4.5.3.1.10: treat as 452
	}
	return fmt.Errorf("%w: %w", ErrRejected, err)
}

// SMTP_TLS values: how an SMTPMailer encrypts its sessions.
const (
	// TLSNone is plain SMTP (a local relay, Mailpit, the test sink).
	TLSNone = "none"
	// TLSStartTLS upgrades the connection with STARTTLS after EHLO (RFC
	// 3207), usually on port 587; a server that does not offer it fails the
	// send, so the session is never silently left in clear text.
	TLSStartTLS = "starttls"
	// TLSImplicit speaks TLS from the first byte (RFC 8314), usually on
	// port 465.
	TLSImplicit = "tls"
)

// SMTPMailer sends through one SMTP server, in clear text or over TLS
// (STARTTLS or implicit), logging in with AUTH PLAIN (RFC 4954) when it has
// a Username. It keeps the sessions of
// finished sends open and sends the next emails through them, one SMTP
// transaction after another (RFC 5321, 3.3), instead of a connection, a
// greeting and an EHLO per email. Safe for concurrent use; Close ends the
// idle sessions.
type SMTPMailer struct {
	// Addr is the server, host:port.
	Addr string
	// TLS is TLSNone (or empty), TLSStartTLS or TLSImplicit (SMTP_TLS).
	TLS string
	// TLSConfig verifies the server when TLS is on (nil: the system's
	// roots); its ServerName defaults to Addr's host. SMTP_TLS_CA_FILE sets
	// RootCAs for a server with a private CA.
	TLSConfig *tls.Config
	// Username and Password log in with AUTH PLAIN after EHLO (and TLS)
	// when Username is set (SMTP_USERNAME, SMTP_PASSWORD). A refused login
	// (535) fails the send temporarily, like any failure before the
	// transaction: fixing the password sends the email.
	Username, Password string
	// HeloName is sent in EHLO ("checkout.local").
	HeloName string
	// MaxIdle is how many sessions stay open between sends (80, the
	// sender's sends at once; negative:
	// none, a connection per email).
	MaxIdle int
	// IdleTimeout closes a session unused for longer instead of reusing it
	// (10s): servers drop idle clients after a while (RFC 5321 suggests at
	// least 5 minutes).
	IdleTimeout time.Duration

	mu   sync.Mutex
	idle []*smtpSession // most recently used last
}

// smtpSession is one open SMTP connection between transactions.
type smtpSession struct {
	conn net.Conn
	c    *smtp.Client
	used time.Time
}

var _ Mailer = (*SMTPMailer)(nil)

// Send delivers e in one SMTP transaction bounded by ctx's deadline (a
// minute without one), on an idle session when there is one. A reused
// session the server closed meanwhile fails at MAIL, before any message
// could have been accepted: the transaction is then tried once more on a
// new connection.
//
// The deadline is kept by closing the connection when ctx ends, not by the
// connection's own deadline: go-smtp's client sets that to its
// CommandTimeout (5 minutes) at every command, so a server that stopped
// answering would hold the send past the sender's claim (ClaimTTL), and
// another sender would send the email again.
func (m *SMTPMailer) Send(ctx context.Context, e Email) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	for attempt := 0; ; attempt++ {
		s, reused, err := m.session(ctx)
		if err != nil {
			return err
		}
		stop := context.AfterFunc(ctx, func() { s.conn.Close() })
		atMail, err := transact(s.c, e)
		open := stop() // false: ctx ended, and the connection is closed
		if err == nil {
			// The message is accepted (250 after DATA). Return now: until
			// the sender records "sent", a crash resends the message, so no
			// round trip belongs in between.
			if open {
				m.release(s)
			} else {
				s.c.Close()
			}
			return nil
		}
		s.c.Close()
		if !open {
			return fmt.Errorf("smtp: send %s: %w (%v)", e.MessageID, ctx.Err(), err)
		}
		if reused && atMail && attempt == 0 {
			continue
		}
		return err
	}
}

// transact sends e as one transaction (MAIL, RCPT, DATA) on c; atMail
// reports that it failed at MAIL, the first command.
func transact(c *smtp.Client, e Email) (atMail bool, err error) {
	to := asciiDomain(e.To)
	var opts *smtp.MailOptions
	if !isASCII(e.From) || !isASCII(to) {
		opts = &smtp.MailOptions{UTF8: true} // RFC 6531
	}
	if err := c.Mail(e.From, opts); err != nil {
		return true, fmt.Errorf("smtp: send %s: mail: %w", e.MessageID, rejected(stageMail, err))
	}
	if err := c.Rcpt(to, nil); err != nil {
		return false, fmt.Errorf("smtp: send %s: rcpt: %w", e.MessageID, rejected(stageRcpt, err))
	}
	w, err := c.Data()
	if err != nil {
		return false, fmt.Errorf("smtp: send %s: data: %w", e.MessageID, rejected(stageData, err))
	}
	if _, err := w.Write(Format(e, time.Now())); err != nil {
		return false, fmt.Errorf("smtp: send %s: %w", e.MessageID, err)
	}
	if err := w.Close(); err != nil {
		return false, fmt.Errorf("smtp: send %s: %w", e.MessageID, rejected(stageData, err))
	}
	return false, nil
}

// session returns an idle session not past IdleTimeout, or a new one after
// the greeting and EHLO; reused tells which.
func (m *SMTPMailer) session(ctx context.Context) (s *smtpSession, reused bool, err error) {
	idleTimeout := m.IdleTimeout
	if idleTimeout <= 0 {
		idleTimeout = 10 * time.Second
	}
	m.mu.Lock()
	for len(m.idle) > 0 {
		s = m.idle[len(m.idle)-1]
		m.idle = m.idle[:len(m.idle)-1]
		if time.Since(s.used) < idleTimeout {
			m.mu.Unlock()
			return s, true, nil
		}
		s.c.Close()
	}
	m.mu.Unlock()

	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", m.Addr)
	if err != nil {
		return nil, false, fmt.Errorf("smtp: dial %s: %w", m.Addr, err)
	}
	// As in Send: ctx's end closes the TCP connection under the TLS
	// handshake, the greeting, EHLO, STARTTLS and AUTH alike.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	c, err := m.open(conn)
	if !stop() { // ctx ended: the connection is closed, whatever open said
		err = errors.Join(ctx.Err(), err)
	}
	if err != nil {
		if c != nil {
			c.Close()
		}
		conn.Close()
		return nil, false, err
	}
	return &smtpSession{conn: conn, c: c}, false, nil
}

// open starts an SMTP session on conn: TLS, greeting and EHLO, STARTTLS,
// AUTH, as configured. On error the returned client, if any, is to be
// closed.
func (m *SMTPMailer) open(conn net.Conn) (*smtp.Client, error) {
	helo := m.HeloName
	if helo == "" {
		helo = "checkout.local"
	}
	var c *smtp.Client
	switch m.TLS {
	case "", TLSNone:
		c = smtp.NewClient(conn)
	case TLSImplicit:
		tc := tls.Client(conn, m.tlsConfig())
		if err := tc.Handshake(); err != nil {
			return nil, fmt.Errorf("smtp: tls handshake with %s: %w", m.Addr, err)
		}
		c = smtp.NewClient(tc)
	case TLSStartTLS:
		// go-smtp sends the first EHLO as "localhost", then EHLO again
		// with HeloName over TLS (Hello below), the one that counts.
		var err error
		if c, err = smtp.NewClientStartTLS(conn, m.tlsConfig()); err != nil {
			return nil, fmt.Errorf("smtp: starttls with %s: %w", m.Addr, err)
		}
	default:
		return nil, fmt.Errorf("smtp: unknown TLS mode %q (want %s, %s or %s)", m.TLS, TLSNone, TLSStartTLS, TLSImplicit)
	}
	if err := c.Hello(helo); err != nil {
		return c, fmt.Errorf("smtp: hello: %w", err)
	}
	if m.Username != "" {
		if err := c.Auth(sasl.NewPlainClient("", m.Username, m.Password)); err != nil {
			return c, fmt.Errorf("smtp: login as %q at %s: %w", m.Username, m.Addr, err)
		}
	}
	return c, nil
}

// tlsConfig is TLSConfig (or a new one) with ServerName set to Addr's host
// when it has none.
func (m *SMTPMailer) tlsConfig() *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if m.TLSConfig != nil {
		cfg = m.TLSConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(m.Addr)
	}
	return cfg
}

// release keeps s for the next send, or closes it when MaxIdle sessions
// are idle already.
func (m *SMTPMailer) release(s *smtpSession) {
	maxIdle := m.MaxIdle
	if maxIdle == 0 {
		maxIdle = 80
	}
	s.used = time.Now()
	m.mu.Lock()
	if len(m.idle) < maxIdle {
		m.idle = append(m.idle, s)
		s = nil
	}
	m.mu.Unlock()
	if s != nil {
		s.c.Close()
	}
}

// Close closes the idle sessions (without QUIT: a server treats a closed
// connection between transactions like one). Sends may still follow; they
// open new sessions.
func (m *SMTPMailer) Close() error {
	m.mu.Lock()
	idle := m.idle
	m.idle = nil
	m.mu.Unlock()
	for _, s := range idle {
		s.c.Close()
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// asciiDomain returns addr with its domain in IDNA ASCII form (RFC 5891,
// "exämple.com" becomes "xn--exmple-cua.com"), so that an address whose
// local part is ASCII reaches servers without SMTPUTF8. A non-ASCII local
// part still needs SMTPUTF8 (RFC 6531); an address that does not convert is
// returned as it is.
func asciiDomain(addr string) string {
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return addr
	}
	domain, err := idna.Lookup.ToASCII(addr[at+1:])
	if err != nil {
		return addr
	}
	return addr[:at+1] + domain
}

// Format renders e as an RFC 5322 message with CRLF line ends, dated date.
func Format(e Email, date time.Time) []byte {
	var b strings.Builder
	header := func(k, v string) {
		b.WriteString(k + ": " + oneLine(v) + "\r\n")
	}
	header("Message-ID", e.MessageID)
	header("Date", date.Format(time.RFC1123Z))
	header("From", e.From)
	header("To", e.To)
	header("Subject", e.Subject)
	header("MIME-Version", "1.0")
	header("Content-Type", "text/plain; charset=utf-8")
	header("Content-Transfer-Encoding", "8bit")
	b.WriteString("\r\n")
	for _, line := range strings.Split(strings.TrimRight(e.Body, "\n"), "\n") {
		b.WriteString(strings.TrimRight(line, "\r") + "\r\n")
	}
	return []byte(b.String())
}

// oneLine drops line breaks, so that no value can inject a header.
func oneLine(s string) string { return lineBreaks.Replace(s) }

// lineBreaks drops CR and turns LF into a space; built once, since building
// a Replacer costs more than using it (a visible part of the worker's CPU).
var lineBreaks = strings.NewReplacer("\r", "", "\n", " ")
