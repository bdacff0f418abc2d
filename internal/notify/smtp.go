package notify

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"time"

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
// message may or may not have been delivered.
type Mailer interface {
	Send(ctx context.Context, e Email) error
}

// SMTPMailer sends through one SMTP server without authentication or TLS
// (a local relay, Mailpit, or the test sink), one connection per email.
type SMTPMailer struct {
	// Addr is the server, host:port.
	Addr string
	// HeloName is sent in EHLO ("checkout.local").
	HeloName string
}

var _ Mailer = (*SMTPMailer)(nil)

// Send delivers e in one SMTP transaction bounded by ctx's deadline.
func (m *SMTPMailer) Send(ctx context.Context, e Email) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", m.Addr)
	if err != nil {
		return fmt.Errorf("smtp: dial %s: %w", m.Addr, err)
	}
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	} else {
		conn.SetDeadline(time.Now().Add(time.Minute))
	}
	c := smtp.NewClient(conn)
	defer c.Close()
	helo := m.HeloName
	if helo == "" {
		helo = "checkout.local"
	}
	if err := c.Hello(helo); err != nil {
		return fmt.Errorf("smtp: hello: %w", err)
	}
	if err := c.SendMail(e.From, []string{asciiDomain(e.To)}, bytes.NewReader(Format(e, time.Now()))); err != nil {
		return fmt.Errorf("smtp: send %s: %w", e.MessageID, err)
	}
	// The message is accepted (250 after DATA). Return now, without waiting
	// for QUIT's reply: until the sender records "sent", a crash resends the
	// message, so no round trip belongs in between. The deferred Close ends
	// the connection; servers treat that like QUIT once DATA was accepted.
	return nil
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
func oneLine(s string) string {
	return strings.NewReplacer("\r", "", "\n", " ").Replace(s)
}
