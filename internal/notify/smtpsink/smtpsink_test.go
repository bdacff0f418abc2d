package smtpsink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/notify/smtpsink"
)

func TestSinkRecordsRejectsAndServesMessages(t *testing.T) {
	t.Parallel()
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	defer sink.Close()
	mailer := &notify.SMTPMailer{Addr: sink.Addr()}
	email := notify.Email{MessageID: notify.MessageID("ntf_1"), From: "orders@checkout.local", To: "a@example.com", Subject: "paid", Body: "Order: ord_1\n"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	sink.Reject(1)
	require.ErrorContains(t, mailer.Send(ctx, email), "451")
	require.Equal(t, 0, sink.Len())

	require.NoError(t, mailer.Send(ctx, email))
	require.NoError(t, mailer.Send(ctx, email))
	require.Equal(t, 2, sink.Count("<notification-ntf_1@checkout.local>"))
	m := sink.Messages()[0]
	require.Equal(t, "orders@checkout.local", m.From)
	require.Equal(t, []string{"a@example.com"}, m.To)
	require.Equal(t, "paid", m.Subject)
	require.Equal(t, "Order: ord_1\r\n", m.Body)

	rec := httptest.NewRecorder()
	sink.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/messages", nil))
	require.Equal(t, 200, rec.Code)
	var got []smtpsink.Message
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Len(t, got, 2)
	require.Equal(t, "<notification-ntf_1@checkout.local>", got[1].MessageID)
}

// TestSinkOutageOverHTTP: PUT /outage makes the sink refuse every message
// with the reply asked for, or close its SMTP port; DELETE /outage brings
// it back on the same address with its messages.
func TestSinkOutageOverHTTP(t *testing.T) {
	t.Parallel()
	sink, err := smtpsink.Start("127.0.0.1:0")
	require.NoError(t, err)
	defer sink.Close()
	mailer := &notify.SMTPMailer{Addr: sink.Addr(), MaxIdle: -1}
	email := func(i int) notify.Email {
		return notify.Email{MessageID: notify.MessageID(fmt.Sprint("ntf_", i)), From: "orders@checkout.local", To: "a@example.com", Subject: "s", Body: "b"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	call := func(method, body string) int {
		rec := httptest.NewRecorder()
		sink.Handler().ServeHTTP(rec, httptest.NewRequest(method, "/outage", strings.NewReader(body)))
		return rec.Code
	}
	require.NoError(t, mailer.Send(ctx, email(1)))

	require.Equal(t, 204, call("PUT", `{"mode":"reject","code":421}`))
	for i := range 3 {
		require.ErrorContains(t, mailer.Send(ctx, email(10+i)), "421")
	}
	require.Equal(t, 204, call("PUT", `{"mode":"reject","code":550}`))
	err = mailer.Send(ctx, email(2))
	require.ErrorIs(t, err, notify.ErrRejected)
	require.Equal(t, 204, call("PUT", `{"mode":"refuse"}`))
	require.ErrorContains(t, mailer.Send(ctx, email(3)), "connection refused")
	require.Equal(t, 400, call("PUT", `{"mode":"melt"}`))

	require.Equal(t, 204, call("DELETE", ""))
	require.NoError(t, mailer.Send(ctx, email(4)))
	require.Equal(t, map[string]int{notify.MessageID("ntf_1"): 1, notify.MessageID("ntf_4"): 1}, sink.CountByMessageID())
}
