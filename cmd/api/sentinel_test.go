package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/testenv"
)

// TestRedisSentinelFailover: with REDIS_SENTINEL_MASTER and
// REDIS_SENTINEL_ADDRS the api finds its Redis through three sentinels.
// The master dies (SIGKILL), the sentinels promote the replica, and the
// api, in DEDUP_FAILURE_MODE=closed, takes checkouts again (twenty in a
// row answered 201, /readyz 200) within 15s of the promotion, without a
// restart; one PaymentIntent per key answered 201. A client pinned to the
// old master's address would be refused for as long as it is down.
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	sentinel := testenv.StartRedisSentinel(t)
	emu := stripeemu.New()
	emuSrv := httptest.NewServer(emu)
	t.Cleanup(emuSrv.Close)
	base := startAPI(t, map[string]string{
		"REDIS_URL":             "redis://127.0.0.1:1/0", // the host is not used: credentials and database only
		"REDIS_SENTINEL_MASTER": sentinel.MasterName,
		"REDIS_SENTINEL_ADDRS":  strings.Join(sentinel.Sentinels, ","),
		"REDIS_KEY_PREFIX":      "sentinel:",
		"STRIPE_API_BASE":       emuSrv.URL,
		"DEDUP_FAILURE_MODE":    "closed",
	})
	for i := range 5 {
		a := postCheckout(t, base, "sk_test_acme", fmt.Sprintf("before-%d", i))
		require.Equal(t, http.StatusCreated, a.status, a.body)
	}

	killed := time.Now()
	sentinel.Kill(sentinel.Master)
	promotion := make(chan time.Time, 1)
	go func() {
		at, err := sentinel.AwaitMaster(context.Background(), sentinel.Replica, time.Minute)
		if err != nil {
			t.Error(err)
		}
		promotion <- at
	}()

	// Checkouts one after the other from the kill on: refused while there
	// is no master, then twenty in a row answered 201 within 15s of the
	// promotion.
	var promoted, lastRefused time.Time
	inARow, sent, refused := 0, 0, 0
	for inARow < 20 {
		if promoted.IsZero() {
			select {
			case promoted = <-promotion:
				require.False(t, promoted.IsZero(), "the replica promoted")
			default:
			}
		}
		require.True(t, time.Since(killed) < time.Minute && (promoted.IsZero() || time.Now().Before(promoted.Add(15*time.Second))),
			"20 checkouts in a row answered 201 within 15s of the promotion (%d sent, %d refused, %d in a row)", sent, refused, inARow)
		a := postCheckout(t, base, "sk_test_acme", fmt.Sprintf("after-%d", sent))
		sent++
		switch a.status {
		case http.StatusCreated:
			if !promoted.IsZero() {
				inARow++
			}
		case http.StatusServiceUnavailable:
			refused++
			lastRefused = time.Now()
			inARow = 0
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("checkout answered %d: %s", a.status, a.body)
		}
	}
	resp, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "ready again")
	require.Equal(t, 5+sent-refused, emu.TotalCreated(), "one PaymentIntent per key answered 201; none for the refused ones")
	last := "none"
	if refused > 0 {
		last = lastRefused.Sub(killed).Round(10 * time.Millisecond).String()
	}
	t.Logf("replica promoted %s after the kill; %d of %d checkouts refused (503), the last %s after the kill",
		promoted.Sub(killed).Round(10*time.Millisecond), refused, sent, last)
}
