package notify_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/notify/smtpsink"
)

func email(i int) notify.Email {
	return notify.Email{MessageID: notify.MessageID(fmt.Sprint("ntf_", i)), From: "orders@checkout.local",
		To: fmt.Sprintf("buyer%d@example.com", i), Subject: fmt.Sprint("s", i), Body: "b"}
}

// sinkAndMailer starts an SMTP sink and a mailer to it, both ended with
// the test.
func sinkAndMailer(t *testing.T) (*smtpsink.Sink, *notify.SMTPMailer) {
	t.Helper()
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	m := &notify.SMTPMailer{Addr: sink.Addr()}
	t.Cleanup(func() { m.Close() })
	return sink, m
}

// TestMailerSendsSeveralEmailsInOneSession: consecutive emails go through
// one SMTP connection, each its own transaction with its own recipient.
func TestMailerSendsSeveralEmailsInOneSession(t *testing.T) {
	t.Parallel()
	sink, m := sinkAndMailer(t)
	for i := range 3 {
		require.NoError(t, m.Send(context.Background(), email(i)))
	}
	require.Equal(t, 1, sink.Sessions(), "one connection for three emails")
	msgs := sink.Messages()
	require.Len(t, msgs, 3)
	for i, msg := range msgs {
		require.Equal(t, []string{fmt.Sprintf("buyer%d@example.com", i)}, msg.To)
		require.Equal(t, notify.MessageID(fmt.Sprint("ntf_", i)), msg.MessageID)
	}

	// A mailer that keeps no session opens one per email.
	single := &notify.SMTPMailer{Addr: sink.Addr(), MaxIdle: -1}
	for i := range 2 {
		require.NoError(t, single.Send(context.Background(), email(10+i)))
	}
	require.Equal(t, 3, sink.Sessions())
}

// TestMailerReplacesASessionTheServerDropped: an idle session whose
// connection died fails at MAIL, before the server could accept anything;
// the email is sent once, on a new connection.
func TestMailerReplacesASessionTheServerDropped(t *testing.T) {
	t.Parallel()
	sink, m := sinkAndMailer(t)
	require.NoError(t, m.Send(context.Background(), email(1)))
	require.Equal(t, 1, notify.BreakIdleSessions(m))

	require.NoError(t, m.Send(context.Background(), email(2)))
	require.Equal(t, 2, sink.Sessions())
	require.Equal(t, map[string]int{notify.MessageID("ntf_1"): 1, notify.MessageID("ntf_2"): 1}, sink.CountByMessageID())
}

// TestMailerDoesNotResendARefusedMessage: a refusal after DATA on a reused
// session is the server's answer, not a dead connection: Send fails and
// the sender's retry decides (nothing sent twice).
func TestMailerDoesNotResendARefusedMessage(t *testing.T) {
	t.Parallel()
	sink, m := sinkAndMailer(t)
	require.NoError(t, m.Send(context.Background(), email(1)))
	sink.Reject(1)
	require.ErrorContains(t, m.Send(context.Background(), email(2)), "451")
	require.NoError(t, m.Send(context.Background(), email(3)))
	require.Equal(t, 2, sink.Len())
	require.Zero(t, sink.Count(notify.MessageID("ntf_2")))
}

// hangingServer is an SMTP server that answers like one (greeting, EHLO,
// 250 to MAIL and RCPT, 354 to DATA, 250 to the message) until the line
// that starts with hangAt ("" for the greeting), and then stops answering
// without closing the connection, as a server stuck on its disk would.
func hangingServer(t *testing.T, hangAt string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		go func() { <-t.Context().Done(); conn.Close() }()
		r := bufio.NewReader(conn)
		if hangAt == "" {
			io.Copy(io.Discard, r)
			return
		}
		fmt.Fprint(conn, "220 hanging\r\n")
		inData := false
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\r\n")
			if inData && line != "." {
				continue
			}
			if strings.HasPrefix(line, hangAt) {
				io.Copy(io.Discard, r) // until the client hangs up
				return
			}
			switch {
			case inData:
				inData = false
				fmt.Fprint(conn, "250 queued\r\n")
			case strings.HasPrefix(line, "EHLO"):
				fmt.Fprint(conn, "250 hanging\r\n")
			case line == "DATA":
				inData = true
				fmt.Fprint(conn, "354 go ahead\r\n")
			default:
				fmt.Fprint(conn, "250 ok\r\n")
			}
		}
	}()
	return ln.Addr().String()
}

// TestMailerGivesUpAtItsDeadline: a server that stops answering, at the
// greeting or in the middle of a transaction, fails the send when its
// context's deadline passes. go-smtp's client resets the connection's
// deadline to 5 minutes at every command; a send that outlived the sender's
// claim (SendTimeout < ClaimTTL) would be sent again by another sender.
func TestMailerGivesUpAtItsDeadline(t *testing.T) {
	t.Parallel()
	for _, hangAt := range []string{"", "EHLO", "MAIL", "RCPT", "DATA", "."} {
		t.Run("at "+hangAt, func(t *testing.T) {
			t.Parallel()
			m := &notify.SMTPMailer{Addr: hangingServer(t, hangAt)}
			t.Cleanup(func() { m.Close() })
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				done <- m.Send(ctx, email(1))
			}()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.DeadlineExceeded)
			case <-time.After(30 * time.Second):
				t.Fatal("the send outlived its deadline by far")
			}
		})
	}
}

// tlsSink starts a sink that demands TLS (STARTTLS, or implicit) and a
// login as "shop" / "right", with a self-signed certificate, and returns
// it with a tls.Config that trusts it.
func tlsSink(t *testing.T, implicit bool) (*smtpsink.Sink, *tls.Config) {
	t.Helper()
	serverCfg, caPEM, err := smtpsink.SelfSigned()
	require.NoError(t, err)
	sink, err := smtpsink.StartWith("127.0.0.1:0", smtpsink.Options{
		TLSConfig: serverCfg, ImplicitTLS: implicit, Username: "shop", Password: "right"})
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))
	return sink, &tls.Config{RootCAs: roots}
}

// TestMailerLogsInOverTLS: against a server that demands STARTTLS (or TLS
// from the first byte) and AUTH, a wrong password, a missing login, no
// TLS and an untrusted certificate each fail the send with an error that
// says so and is temporary (not ErrRejected: the email is retried once the
// setting is fixed); the right settings deliver the email once, over TLS,
// as the account.
func TestMailerLogsInOverTLS(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{notify.TLSStartTLS, notify.TLSImplicit} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			sink, trust := tlsSink(t, mode == notify.TLSImplicit)
			send := func(m *notify.SMTPMailer, i int) error {
				t.Cleanup(func() { m.Close() })
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return m.Send(ctx, email(i))
			}
			failures := map[string]struct {
				mailer *notify.SMTPMailer
				want   string
			}{
				"wrong password": {&notify.SMTPMailer{Addr: sink.Addr(), TLS: mode, TLSConfig: trust, Username: "shop", Password: "wrong"},
					`login as "shop"`},
				"no login":       {&notify.SMTPMailer{Addr: sink.Addr(), TLS: mode, TLSConfig: trust}, "530"},
				"untrusted cert": {&notify.SMTPMailer{Addr: sink.Addr(), TLS: mode, Username: "shop", Password: "right"}, "certificate"},
			}
			if mode == notify.TLSStartTLS {
				failures["no TLS"] = struct {
					mailer *notify.SMTPMailer
					want   string
				}{&notify.SMTPMailer{Addr: sink.Addr(), Username: "shop", Password: "right"}, "TLS is required"}
			}
			for name, f := range failures {
				err := send(f.mailer, 1)
				require.ErrorContains(t, err, f.want, name)
				require.NotErrorIs(t, err, notify.ErrRejected, "%s is temporary", name)
			}
			require.ErrorContains(t, send(failures["wrong password"].mailer, 1), "535")
			require.Zero(t, sink.Len())

			right := &notify.SMTPMailer{Addr: sink.Addr(), TLS: mode, TLSConfig: trust, Username: "shop", Password: "right"}
			require.NoError(t, send(right, 1))
			require.NoError(t, send(right, 2), "a reused session stays logged in")
			msgs := sink.Messages()
			require.Len(t, msgs, 2)
			require.True(t, msgs[0].TLS)
			require.Equal(t, "shop", msgs[0].User)
			require.Equal(t, map[string]int{notify.MessageID("ntf_1"): 1, notify.MessageID("ntf_2"): 1}, sink.CountByMessageID())
		})
	}
}

// TestMailerRefusesAServerWithoutSTARTTLS: with SMTP_TLS=starttls, a
// server that does not offer STARTTLS fails the send instead of getting
// the password and the email in clear text.
func TestMailerRefusesAServerWithoutSTARTTLS(t *testing.T) {
	t.Parallel()
	sink, m := sinkAndMailer(t)
	m.TLS, m.Username, m.Password = notify.TLSStartTLS, "shop", "right"
	err := m.Send(context.Background(), email(1))
	require.ErrorContains(t, err, "STARTTLS")
	require.Zero(t, sink.Len())
}

// replyServer is an SMTP server that accepts everything, except that it
// answers reply (e.g. "552 5.2.2 mailbox full") to the first command that
// starts with at ("MAIL", "RCPT", "DATA", or "." for the end of the
// message). It serves one connection.
func replyServer(t *testing.T, at, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		go func() { <-t.Context().Done(); conn.Close() }()
		r := bufio.NewReader(conn)
		fmt.Fprint(conn, "220 scripted ESMTP\r\n")
		inData := false
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimRight(line, "\r\n")
			if inData && line != "." {
				continue
			}
			answer := "250 ok"
			switch {
			case inData:
				inData = false
				answer = "250 queued"
			case strings.HasPrefix(line, "EHLO"):
				answer = "250 scripted"
			case line == "DATA":
				inData = true
				answer = "354 go ahead"
			case strings.HasPrefix(line, "QUIT"):
				fmt.Fprint(conn, "221 bye\r\n")
				return
			}
			if at != "" && strings.HasPrefix(line, at) {
				answer, at = reply, ""
				inData = false
			}
			fmt.Fprint(conn, answer+"\r\n")
		}
	}()
	return ln.Addr().String()
}

// TestMailerTellsPermanentFromTemporaryReplies: only a 5xx reply about the
// message (to MAIL, RCPT or DATA) is ErrRejected, which fails a
// notification at once; 4xx replies, and the 5xx replies that are about
// the session or that RFC 5321 says to treat as temporary, are retried.
func TestMailerTellsPermanentFromTemporaryReplies(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		at, reply string
		permanent bool
	}{
		"550 to RCPT, no such user":            {"RCPT", "550 5.1.1 no such user", true},
		"553 to MAIL, sender refused":          {"MAIL", "553 5.7.1 sender not allowed", true},
		"554 after the message, spam":          {".", "554 5.7.1 message refused", true},
		"451 to RCPT, greylisted":              {"RCPT", "451 4.7.1 try again later", false},
		"421 to MAIL, shutting down":           {"MAIL", "421 4.3.2 shutting down", false},
		"452 after the message, disk full":     {".", "452 4.3.1 insufficient storage", false},
		"552 to RCPT, RFC 5321 says 452":       {"RCPT", "552 5.2.2 mailbox full", false},
		"530 to MAIL, authentication required": {"MAIL", "530 5.7.0 authentication required", false},
		"502 5.7.0 to MAIL, go-smtp's login":   {"MAIL", "502 5.7.0 please authenticate first", false},
		"554 to EHLO, no service":              {"EHLO", "554 5.3.2 no service here", false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := &notify.SMTPMailer{Addr: replyServer(t, tt.at, tt.reply), MaxIdle: -1}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := m.Send(ctx, email(1))
			code, _, _ := strings.Cut(tt.reply, " ")
			require.ErrorContains(t, err, code)
			require.Equal(t, tt.permanent, errors.Is(err, notify.ErrRejected), "%v", err)
		})
	}
}
