package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/testenv"
)

func TestRunRejectsBadValues(t *testing.T) {
	t.Parallel()
	for name, val := range map[string]string{
		"API_URL":         "127.0.0.1:8080",
		"STOREFRONT_ADDR": "not-an-address",
	} {
		env := map[string]string{"STOREFRONT_ADDR": "127.0.0.1:0", name: val}
		err := run(t.Context(), func(k string) string { return env[k] }, io.Discard)
		require.ErrorContains(t, err, name)
	}
}

// TestRunServesAndDrains: the shop answers on STOREFRONT_ADDR (its product
// page too, which needs the API: without one it says so with a 502), and a
// canceled context stops it with nil.
func TestRunServesAndDrains(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	dead := "http://" + addr // nothing listens there once closed
	ln.Close()
	shopAddr := testenv.FreeAddr(t)

	ctx, cancel := context.WithCancel(t.Context())
	env := map[string]string{"STOREFRONT_ADDR": shopAddr, "API_URL": dead}
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(k string) string { return env[k] }, io.Discard) }()
	require.Eventually(t, func() bool {
		res, err := http.Get("http://" + shopAddr + "/healthz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	}, 5*time.Second, 20*time.Millisecond)
	res, err := http.Get("http://" + shopAddr + "/")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusBadGateway, res.StatusCode)
	cancel()
	require.NoError(t, <-done)
	http.DefaultClient.CloseIdleConnections()
}
