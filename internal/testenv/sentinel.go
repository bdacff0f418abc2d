package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisSentinel is a Redis master with one replica, watched by three
// sentinels (quorum 2), all redis-server processes a test owns on free
// ports. The sentinels mark the master down after 2s without an answer
// and then promote the replica.
type RedisSentinel struct {
	// MasterName is the name the sentinels monitor ("checkout").
	MasterName string
	// Master and Replica are the addresses at start.
	Master, Replica string
	// Sentinels are the sentinels' addresses.
	Sentinels []string

	mu    sync.Mutex
	procs map[string]*Proc // by address; nil once killed
}

// StartRedisSentinel starts the master, the replica and the three
// sentinels, and waits until the replica is in sync and every sentinel
// knows the replica and the two other sentinels. Everything is killed in
// t.Cleanup.
func StartRedisSentinel(t testing.TB) *RedisSentinel {
	t.Helper()
	dir := t.TempDir()
	s := &RedisSentinel{MasterName: "checkout", procs: map[string]*Proc{}}
	t.Cleanup(func() {
		s.mu.Lock()
		addrs := make([]string, 0, len(s.procs))
		for a := range s.procs {
			addrs = append(addrs, a)
		}
		s.mu.Unlock()
		for _, a := range addrs {
			s.Kill(a)
		}
	})
	start := func(addr string, args ...string) {
		t.Helper()
		proc, err := StartProc(exec.Command("redis-server", args...), "")
		if err != nil {
			t.Fatalf("testenv: start redis-server %v: %v", args, err)
		}
		s.mu.Lock()
		s.procs[addr] = proc
		s.mu.Unlock()
		waitDial(t, addr)
	}
	mport, rport := strconv.Itoa(FreePort(t)), strconv.Itoa(FreePort(t))
	s.Master, s.Replica = "127.0.0.1:"+mport, "127.0.0.1:"+rport
	common := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}
	start(s.Master, append([]string{"--port", mport}, common...)...)
	start(s.Replica, append([]string{"--port", rport, "--replicaof", "127.0.0.1", mport}, common...)...)
	ctx := context.Background()
	awaitRedis(t, s.Replica, 20*time.Second, func(rdb *redis.Client) bool {
		info, err := rdb.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, "replica in sync")

	for i := range 3 {
		port := strconv.Itoa(FreePort(t))
		conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d.conf", i))
		body := fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\n"+
			"sentinel monitor %s 127.0.0.1 %s 2\n"+
			"sentinel down-after-milliseconds %[3]s 2000\n"+
			"sentinel failover-timeout %[3]s 10000\n"+
			"sentinel parallel-syncs %[3]s 1\n", port, dir, s.MasterName, mport)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		addr := "127.0.0.1:" + port
		start(addr, conf, "--sentinel")
		s.Sentinels = append(s.Sentinels, addr)
	}
	for _, addr := range s.Sentinels {
		awaitRedis(t, addr, 30*time.Second, func(rdb *redis.Client) bool {
			sc := redis.NewSentinelClient(rdb.Options())
			defer sc.Close()
			replicas, err1 := sc.Replicas(ctx, s.MasterName).Result()
			sentinels, err2 := sc.Sentinels(ctx, s.MasterName).Result()
			return err1 == nil && err2 == nil && len(replicas) == 1 && len(sentinels) == 2
		}, "sentinel knows the replica and the other sentinels")
	}
	return s
}

// Kill kills the process at addr with SIGKILL and waits for it. Killing a
// dead one does nothing.
func (s *RedisSentinel) Kill(addr string) {
	s.mu.Lock()
	proc := s.procs[addr]
	s.procs[addr] = nil
	s.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
}

// AwaitMaster waits until every live sentinel names addr as the master
// and addr reports role:master; it returns when that was first seen.
func (s *RedisSentinel) AwaitMaster(ctx context.Context, addr string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, sa := range s.Sentinels {
			s.mu.Lock()
			dead := s.procs[sa] == nil
			s.mu.Unlock()
			if dead {
				continue
			}
			sc := redis.NewSentinelClient(&redis.Options{Addr: sa})
			got, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
			sc.Close()
			if err != nil || len(got) != 2 || got[0]+":"+got[1] != addr {
				ok = false
				break
			}
		}
		if ok {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			info, err := rdb.Info(ctx, "replication").Result()
			rdb.Close()
			if err == nil && strings.Contains(info, "role:master") {
				return time.Now(), nil
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("testenv: %s not the master after %s", addr, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func awaitRedis(t testing.TB, addr string, timeout time.Duration, cond func(*redis.Client) bool, what string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(timeout)
	for !cond(rdb) {
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %s: not %s after %s", addr, what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
