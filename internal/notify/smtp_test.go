package notify_test

import (
	"bufio"
	"context"
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
