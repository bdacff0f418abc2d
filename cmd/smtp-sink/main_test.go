package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/notify/smtpsink"
	"github.com/onceonly/checkout/internal/testenv"
)

// TestSinkDemandsSTARTTLSAndLogin: with SMTP_SINK_TLS=starttls and an
// account, the sink writes its certificate to SMTP_SINK_CERT_FILE; a
// mailer that trusts that file and logs in delivers, one that does not
// log in is refused; GET /messages shows the message, over TLS.
func TestSinkDemandsSTARTTLSAndLogin(t *testing.T) {
	t.Parallel()
	certFile := filepath.Join(t.TempDir(), "sink.pem")
	smtpAddr, httpAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	env := map[string]string{"SMTP_SINK_ADDR": smtpAddr, "SMTP_SINK_HTTP_ADDR": httpAddr,
		"SMTP_SINK_TLS": "starttls", "SMTP_SINK_CERT_FILE": certFile,
		"SMTP_SINK_USERNAME": "shop", "SMTP_SINK_PASSWORD": "right"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(k string) string { return env[k] }, io.Discard) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	var roots *x509.CertPool
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(certFile)
		if err != nil {
			return false
		}
		roots = x509.NewCertPool()
		return roots.AppendCertsFromPEM(b)
	}, 5*time.Second, 10*time.Millisecond, "certificate written")
	email := notify.Email{MessageID: notify.MessageID("ntf_1"), From: "orders@checkout.local", To: "a@example.com", Subject: "s", Body: "b"}
	send := func(m *notify.SMTPMailer) error {
		defer m.Close()
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		return m.Send(sctx, email)
	}
	trust := &tls.Config{RootCAs: roots}
	require.Eventually(t, func() bool {
		_, err := net.Dial("tcp", smtpAddr)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	require.ErrorContains(t, send(&notify.SMTPMailer{Addr: smtpAddr, TLS: notify.TLSStartTLS, TLSConfig: trust}), "530")
	require.NoError(t, send(&notify.SMTPMailer{Addr: smtpAddr, TLS: notify.TLSStartTLS, TLSConfig: trust, Username: "shop", Password: "right"}))

	resp, err := http.Get("http://" + httpAddr + "/messages")
	require.NoError(t, err)
	defer resp.Body.Close()
	var msgs []smtpsink.Message
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&msgs))
	require.Len(t, msgs, 1)
	require.True(t, msgs[0].TLS)
	require.Equal(t, "shop", msgs[0].User)
}

func TestBadTLSSettingIsRefused(t *testing.T) {
	t.Parallel()
	_, err := options(func(k string) string { return map[string]string{"SMTP_SINK_TLS": "ssl"}[k] })
	require.ErrorContains(t, err, "SMTP_SINK_TLS")
	_, err = options(func(k string) string { return map[string]string{"SMTP_SINK_TLS": "tls"}[k] })
	require.ErrorContains(t, err, "SMTP_SINK_CERT_FILE")
}
