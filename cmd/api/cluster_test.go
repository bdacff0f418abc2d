package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/testenv"
)

// TestRedisCluster: with REDIS_CLUSTER=true the api runs on a Redis Cluster
// (CONTRACT.md, "Replicas"), three masters of its own: a checkout, its
// replay from the Redis cache byte for byte, duplicates in flight refused
// with 409 while one executes, one PaymentIntent per key, and the rate
// limit, each script running on the node of its key's slot. The keys land on
// more than one node, so this is a cluster at work, not one server.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartRedisCluster(t, 3)
	emu := stripeemu.New()
	emuSrv := httptest.NewServer(emu)
	t.Cleanup(emuSrv.Close)
	base := startAPI(t, map[string]string{
		"REDIS_CLUSTER":      "true",
		"REDIS_URL":          cluster.URL(),
		"REDIS_KEY_PREFIX":   "cluster:",
		"STRIPE_API_BASE":    emuSrv.URL,
		"RATE_LIMIT_TENANTS": "globex:1/s",
	})

	resp, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// Checkouts under 12 keys, each sent twice: the second is a replay.
	for i := range 12 {
		key := fmt.Sprintf("cluster-%d", i)
		first := postCheckout(t, base, "sk_test_acme", key)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		require.Empty(t, first.replayed)
		again := postCheckout(t, base, "sk_test_acme", key)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, "true", again.replayed)
		require.Equal(t, first.body, again.body, "the stored body byte for byte")
		require.Equal(t, first.location, again.location)
	}
	require.Equal(t, 12, emu.TotalCreated(), "one PaymentIntent per key")

	// The replays came from the cluster: the responses are cached there,
	// across more than one master.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { cc.Close() })
	var mu sync.Mutex
	perNode := map[string]int{}
	require.NoError(t, cc.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		keys, err := node.Keys(ctx, "cluster:idem:*:resp").Result()
		mu.Lock()
		perNode[node.Options().Addr] = len(keys)
		mu.Unlock()
		return err
	}))
	total, nodes := 0, 0
	for _, n := range perNode {
		total += n
		if n > 0 {
			nodes++
		}
	}
	require.Equal(t, 12, total, "each finished key's response cached: %v", perNode)
	require.Greater(t, nodes, 1, "the keys spread over the cluster's masters: %v", perNode)

	// Ten duplicates at once while the first waits on Stripe: one runs.
	require.NoError(t, emu.Inject(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 500 * time.Millisecond}))
	answers := make(chan answer, 10)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers <- postCheckout(t, base, "sk_test_acme", "cluster-dup")
		}()
	}
	wg.Wait()
	close(answers)
	executed, inFlight, replayed := 0, 0, 0
	for a := range answers {
		switch {
		case a.status == http.StatusCreated && a.replayed == "":
			executed++
		case a.status == http.StatusCreated:
			replayed++ // arrived after the first finished
		case a.status == http.StatusConflict:
			require.Contains(t, a.body, "idempotency_key_in_use")
			inFlight++
		default:
			t.Errorf("duplicate answered %d: %s", a.status, a.body)
		}
	}
	require.Equal(t, 1, executed, "one execution (%d in flight, %d replayed)", inFlight, replayed)
	require.Positive(t, inFlight, "duplicates in flight refused")
	require.Equal(t, 13, emu.TotalCreated())

	// globex's limit is 1/s with bursts of 2: five at once, some refused.
	limited := 0
	for i := range 5 {
		a := postCheckout(t, base, "sk_test_globex", fmt.Sprintf("cluster-globex-%d", i))
		if a.status == http.StatusTooManyRequests {
			require.Contains(t, a.body, "rate_limited")
			limited++
		}
	}
	require.Positive(t, limited, "the rate limit works on the cluster")
}

type answer struct {
	status             int
	body               string
	replayed, location string
}

func postCheckout(t *testing.T, base, apiKey, key string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/checkouts", strings.NewReader(
		`{"email":"buyer@example.com","items":[{"sku":"sku_mug","quantity":1}],"payment_method":"pm_card_visa"}`))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("checkout %s: %v", key, err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(b),
		replayed: resp.Header.Get("Idempotent-Replayed"), location: resp.Header.Get("Location")}
}

// TestRedisClusterSettings: REDIS_CLUSTER's own bad values stop the api at
// start, naming the variable.
func TestRedisClusterSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"not a boolean", map[string]string{"REDIS_CLUSTER": "maybe"}, "REDIS_CLUSTER"},
		{"a database other than 0", map[string]string{"REDIS_CLUSTER": "true", "REDIS_URL": "redis://127.0.0.1:7000/3"}, "REDIS_URL (REDIS_CLUSTER=true): database \"3\""},
		{"not a redis URL", map[string]string{"REDIS_CLUSTER": "true", "REDIS_URL": "http://127.0.0.1:7000"}, "REDIS_URL (REDIS_CLUSTER=true)"},
		{"seed nodes without the setting", map[string]string{"REDIS_URL": "redis://127.0.0.1:7000?addr=127.0.0.1:7001"}, "REDIS_URL"},
		{"a sentinel master without sentinels", map[string]string{"REDIS_SENTINEL_MASTER": "checkout"}, "REDIS_SENTINEL_MASTER, REDIS_SENTINEL_ADDRS: set both or neither"},
		{"sentinels without a master", map[string]string{"REDIS_SENTINEL_ADDRS": "127.0.0.1:26379"}, "set both or neither"},
		{"a sentinel without a port", map[string]string{"REDIS_SENTINEL_MASTER": "checkout", "REDIS_SENTINEL_ADDRS": "127.0.0.1:26379,sentinel-2"}, `REDIS_SENTINEL_ADDRS: "sentinel-2"`},
		{"sentinel and cluster", map[string]string{"REDIS_SENTINEL_MASTER": "checkout", "REDIS_SENTINEL_ADDRS": "127.0.0.1:26379", "REDIS_CLUSTER": "true"}, "exclude each other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), env(tc.env), io.Discard)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestRedisClusterFailoverRecoversAtOnce: a master of the api's Redis
// Cluster dies and its replica takes over. With DEDUP_FAILURE_MODE=closed
// the api refuses (503) the keys of the dead master's slots until then,
// and must take them all again as soon as the replica is master: twenty
// checkouts in a row answered 201, and /readyz 200, within 15s of the
// promotion. go-redis alone kept sending those slots' commands to the dead
// address until its slot map was a minute old (reloadOnNodeLoss): 503 for
// a third of the keys for up to a minute.
func TestRedisClusterFailoverRecoversAtOnce(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartRedisClusterWithReplicas(t, 3)
	emu := stripeemu.New()
	emuSrv := httptest.NewServer(emu)
	t.Cleanup(emuSrv.Close)
	base := startAPI(t, map[string]string{
		"REDIS_CLUSTER":      "true",
		"REDIS_URL":          cluster.URL(),
		"REDIS_KEY_PREFIX":   "failover:",
		"STRIPE_API_BASE":    emuSrv.URL,
		"DEDUP_FAILURE_MODE": "closed",
	})
	for i := range 12 {
		a := postCheckout(t, base, "sk_test_acme", fmt.Sprintf("before-%d", i))
		require.Equal(t, http.StatusCreated, a.status, a.body)
	}

	ctx := context.Background()
	masters, err := cluster.Masters(ctx)
	require.NoError(t, err)
	var master, replica string
	for m, r := range masters {
		if r != "" {
			master, replica = m, r
			break
		}
	}
	require.NotEmpty(t, replica, "a master with a replica: %v", masters)
	cluster.Kill(master)
	promoted, err := cluster.AwaitPromotion(ctx, replica, 30*time.Second)
	require.NoError(t, err)

	deadline := promoted.Add(15 * time.Second)
	inARow, sent, refused := 0, 0, 0
	for inARow < 20 {
		require.True(t, time.Now().Before(deadline),
			"20 checkouts in a row answered 201 within 15s of the promotion (%d sent, %d refused, %d in a row)", sent, refused, inARow)
		a := postCheckout(t, base, "sk_test_acme", fmt.Sprintf("after-%d", sent))
		sent++
		switch a.status {
		case http.StatusCreated:
			inARow++
		case http.StatusServiceUnavailable:
			refused++
			inARow = 0
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("checkout answered %d: %s", a.status, a.body)
		}
	}
	for range 10 {
		resp, err := http.Get(base + "/readyz")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "ready again")
	}
	require.Equal(t, 12+inARow, emu.TotalCreated(), "one PaymentIntent per key answered 201; none for the refused ones")
	t.Logf("after the promotion: %d refused before 20 in a row", refused)
}
