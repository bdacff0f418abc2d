package notify_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/notify/smtpsink"
)

func email(i int) notify.Email {
	return notify.Email{MessageID: notify.MessageID(fmt.Sprint("ntf_", i)), From: "orders@checkout.local",
		To: fmt.Sprintf("buyer%d@example.com", i), Subject: fmt.Sprint("s", i), Body: "b"}
}

// TestMailerSendsSeveralEmailsInOneSession: consecutive emails go through
// one SMTP connection, each its own transaction with its own recipient.
func TestMailerSendsSeveralEmailsInOneSession(t *testing.T) {
	t.Parallel()
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	m := &notify.SMTPMailer{Addr: sink.Addr()}
	t.Cleanup(func() { m.Close() })
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
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	m := &notify.SMTPMailer{Addr: sink.Addr()}
	t.Cleanup(func() { m.Close() })
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
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	m := &notify.SMTPMailer{Addr: sink.Addr()}
	t.Cleanup(func() { m.Close() })
	require.NoError(t, m.Send(context.Background(), email(1)))
	sink.Reject(1)
	require.ErrorContains(t, m.Send(context.Background(), email(2)), "451")
	require.NoError(t, m.Send(context.Background(), email(3)))
	require.Equal(t, 2, sink.Len())
	require.Zero(t, sink.Count(notify.MessageID("ntf_2")))
}
