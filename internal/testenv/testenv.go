// Package testenv gives tests isolated use of the machine's shared services:
// a Redis key prefix of their own on the shared Redis, or a Redis server of
// their own that they may stop, and free ports.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisURL is the shared Redis: $TEST_REDIS_URL or the local one.
func RedisURL() string {
	if u := os.Getenv("TEST_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// Redis returns a client of the shared Redis and a key prefix unique to the
// test ("test:<random>:"). Keys under the prefix are deleted in t.Cleanup.
func Redis(t testing.TB) (*redis.Client, string) {
	t.Helper()
	opts, err := redis.ParseURL(RedisURL())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	rdb := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("testenv: redis at %s: %v (is Redis running?)", RedisURL(), err)
	}
	prefix := "test:" + Random(6) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		rdb.Close()
	})
	return rdb, prefix
}

// RedisServer is a redis-server process a test owns.
type RedisServer struct {
	Addr string
	proc *Proc
}

// StartRedis starts redis-server on a free port, without persistence, and
// waits until it answers. It is killed in t.Cleanup.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	s := &RedisServer{Addr: "127.0.0.1:" + strconv.Itoa(FreePort(t))}
	s.start(t)
	return s
}

func (s *RedisServer) start(t testing.TB) {
	t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	proc, err := StartProc(exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no"), "")
	if err != nil {
		t.Fatalf("testenv: start redis-server: %v", err)
	}
	s.proc = proc
	t.Cleanup(func() { s.Stop() })
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("testenv: redis-server on %s did not start", s.Addr)
}

// URL returns the server's redis:// URL.
func (s *RedisServer) URL() string { return "redis://" + s.Addr + "/0" }

// Stop kills the server (SIGKILL: a crash, not a shutdown) and waits for it.
func (s *RedisServer) Stop() {
	if s.proc != nil {
		s.proc.Kill()
		s.proc = nil
	}
}

// Restart starts the server again on the same port, empty.
func (s *RedisServer) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	s.start(t)
}

// Random returns 2n random hex digits, for unique names.
func Random(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("testenv: random: %v", err))
	}
	return hex.EncodeToString(b)
}

// RedisCluster is a Redis Cluster of redis-server processes a test owns:
// masters only (StartRedisCluster), or a replica per master
// (StartRedisClusterWithReplicas), the 16384 slots split between the
// masters.
type RedisCluster struct {
	Addrs []string

	mu    sync.Mutex
	procs map[string]*Proc // by address; nil once killed
}

// StartRedisCluster starts n redis-servers (n >= 3, the least
// redis-cli --cluster create accepts) in cluster mode on free ports, each
// with its cluster bus on another free port and its nodes.conf in a
// directory of the test, joins them into one cluster without replicas and
// waits until every node reports cluster_state:ok. They are killed in
// t.Cleanup.
func StartRedisCluster(t testing.TB, n int) *RedisCluster {
	t.Helper()
	return startRedisCluster(t, n, 0)
}

// StartRedisClusterWithReplicas starts a cluster of masters (>= 3) with a
// replica each (redis-cli --cluster create --cluster-replicas 1), as
// StartRedisCluster does, and waits until every replica has synchronised
// with its master. cluster-node-timeout is 2s: a replica starts its
// failover about 2 to 4s after its master dies.
func StartRedisClusterWithReplicas(t testing.TB, masters int) *RedisCluster {
	t.Helper()
	c := startRedisCluster(t, 2*masters, 1)
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range c.Addrs {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := rdb.Info(ctx, "replication").Result()
			if err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				rdb.Close()
				t.Fatalf("testenv: redis cluster node %s not in sync: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rdb.Close()
	}
	return c
}

func startRedisCluster(t testing.TB, n, replicas int) *RedisCluster {
	t.Helper()
	dir := t.TempDir()
	c := &RedisCluster{procs: map[string]*Proc{}}
	t.Cleanup(func() {
		for _, addr := range c.Addrs {
			c.Kill(addr)
		}
	})
	for i := range n {
		port, bus := strconv.Itoa(FreePort(t)), strconv.Itoa(FreePort(t))
		cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--cluster-enabled", "yes", "--cluster-port", bus,
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i), "--cluster-node-timeout", "2000")
		proc, err := StartProc(cmd, "")
		if err != nil {
			t.Fatalf("testenv: start redis-server (cluster): %v", err)
		}
		addr := "127.0.0.1:" + port
		c.Addrs = append(c.Addrs, addr)
		c.procs[addr] = proc
	}
	for _, addr := range c.Addrs {
		waitDial(t, addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range c.Addrs {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := rdb.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				rdb.Close()
				t.Fatalf("testenv: redis cluster node %s not ok: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rdb.Close()
	}
	return c
}

// Kill kills the node at addr with SIGKILL (a crash) and waits for it.
// Killing a dead node does nothing.
func (c *RedisCluster) Kill(addr string) {
	c.mu.Lock()
	proc := c.procs[addr]
	c.procs[addr] = nil
	c.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
}

// Alive returns the addresses of the nodes not killed.
func (c *RedisCluster) Alive() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, a := range c.Addrs {
		if c.procs[a] != nil {
			out = append(out, a)
		}
	}
	return out
}

// Masters returns, as a live node sees it (CLUSTER SHARDS), each master's
// address with the address of a replica of it ("" when it has none),
// leaving out the nodes it sees failed.
func (c *RedisCluster) Masters(ctx context.Context) (map[string]string, error) {
	alive := c.Alive()
	if len(alive) == 0 {
		return nil, fmt.Errorf("testenv: no redis cluster node alive")
	}
	rdb := redis.NewClient(&redis.Options{Addr: alive[0]})
	defer rdb.Close()
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, sh := range shards {
		master, replica := "", ""
		for _, n := range sh.Nodes {
			// "fail" is a dead node. Not "online" alone: Redis 7.0 shows a
			// synchronised replica as "loading" while its master has had
			// no write.
			if n.Health == "fail" {
				continue
			}
			addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			if n.Role == "master" {
				master = addr
			} else if replica == "" {
				replica = addr
			}
		}
		if master != "" {
			out[master] = replica
		}
	}
	return out, nil
}

// AwaitPromotion waits until replica reports role:master and every live
// node reports cluster_state:ok, i.e. the replica took over its dead
// master's slots; it returns when that was first seen.
func (c *RedisCluster) AwaitPromotion(ctx context.Context, replica string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		if ok, err := c.promoted(ctx, replica); ok {
			return time.Now(), nil
		} else if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("testenv: %s not master of an ok cluster after %s: %v", replica, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *RedisCluster) promoted(ctx context.Context, replica string) (bool, error) {
	rdb := redis.NewClient(&redis.Options{Addr: replica})
	info, err := rdb.Info(ctx, "replication").Result()
	rdb.Close()
	if err != nil || !strings.Contains(info, "role:master") {
		return false, err
	}
	for _, addr := range c.Alive() {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		ci, err := rdb.ClusterInfo(ctx).Result()
		rdb.Close()
		if err != nil || !strings.Contains(ci, "cluster_state:ok") {
			return false, fmt.Errorf("%s: %v %s", addr, err, ci)
		}
	}
	return true, nil
}

// URL is the cluster's seed URL as REDIS_URL takes it with REDIS_CLUSTER=true
// (redis.ParseClusterURL): the first node, the others as addr parameters.
func (c *RedisCluster) URL() string {
	u := "redis://" + c.Addrs[0]
	for i, a := range c.Addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + a
	}
	return u
}

func waitDial(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("testenv: redis-server on %s did not start", addr)
}
