package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisSettings are the api's Redis variables.
type redisSettings struct {
	URL            string // REDIS_URL
	Cluster        bool   // REDIS_CLUSTER
	SentinelMaster string // REDIS_SENTINEL_MASTER
	SentinelAddrs  string // REDIS_SENTINEL_ADDRS, host:port,host:port,...
}

// redisClient returns a constructor of the client the settings name,
// parsed now so that a bad value stops the process before anything starts.
//
// By default REDIS_URL is one server (redis.ParseURL:
// redis://[user:password@]host:port/db).
//
// With REDIS_CLUSTER=true it is a Redis Cluster (redis.ParseClusterURL):
// REDIS_URL's host and every addr query parameter are seed nodes, e.g.
// redis://10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000, from which the
// client learns the cluster's slots and follows its MOVED and ASK
// redirections, and its failovers (reloadOnNodeLoss). A cluster has only
// database 0. The service works the same on both: every script it runs
// touches the keys of one hash tag (an idempotency key's lease and
// response, a tenant's rate buckets), which one slot holds.
//
// With REDIS_SENTINEL_MASTER (the name Sentinel monitors, e.g. "mymaster")
// and REDIS_SENTINEL_ADDRS (the sentinels, host:port separated by commas)
// the client asks the sentinels for the master's address and follows it
// when they fail it over (go-redis's FailoverClient). REDIS_URL then gives
// only the credentials and the database; its host is not used.
//
// Short timeouts either way: Redis is an accelerator; a hung Redis must
// turn into DEDUP_FAILURE_MODE quickly, not into a hung checkout.
func redisClient(rs redisSettings) (func() redis.UniversalClient, error) {
	const (
		dial       = time.Second
		readWrite  = 500 * time.Millisecond
		maxRetries = 1
	)
	rawURL := rs.URL
	if (rs.SentinelMaster == "") != (rs.SentinelAddrs == "") {
		return nil, fmt.Errorf("REDIS_SENTINEL_MASTER, REDIS_SENTINEL_ADDRS: set both or neither")
	}
	if rs.SentinelMaster != "" {
		if rs.Cluster {
			return nil, fmt.Errorf("REDIS_SENTINEL_MASTER: Sentinel and REDIS_CLUSTER=true exclude each other")
		}
		o, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		var addrs []string
		for _, a := range strings.Split(rs.SentinelAddrs, ",") {
			a = strings.TrimSpace(a)
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, fmt.Errorf("REDIS_SENTINEL_ADDRS: %q: %w", a, err)
			}
			addrs = append(addrs, a)
		}
		fo := &redis.FailoverOptions{
			MasterName:    rs.SentinelMaster,
			SentinelAddrs: addrs,
			Username:      o.Username,
			Password:      o.Password,
			DB:            o.DB,
			TLSConfig:     o.TLSConfig,
			DialTimeout:   dial,
			ReadTimeout:   readWrite,
			WriteTimeout:  readWrite,
			MaxRetries:    maxRetries,
		}
		return func() redis.UniversalClient { return redis.NewFailoverClient(fo) }, nil
	}
	if !rs.Cluster {
		o, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries = dial, readWrite, readWrite, maxRetries
		return func() redis.UniversalClient { return redis.NewClient(o) }, nil
	}
	o, err := redis.ParseClusterURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL (REDIS_CLUSTER=true): %w", err)
	}
	if u, _ := url.Parse(rawURL); u != nil {
		if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
			return nil, fmt.Errorf("REDIS_URL (REDIS_CLUSTER=true): database %q: a Redis Cluster has only database 0", db)
		}
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries = dial, readWrite, readWrite, maxRetries
	return func() redis.UniversalClient {
		cc := redis.NewClusterClient(o)
		cc.AddHook(reloadOnNodeLoss{cc})
		return cc
	}, nil
}

// reloadOnNodeLoss makes a cluster client reload the cluster's slot map as
// soon as a command fails for want of its node, instead of up to a minute
// later.
//
// go-redis reloads the slot map on MOVED and ASK answers, and otherwise
// only when it is older than ClusterStateReloadInterval (60s by default).
// A master that dies answers nothing, so never MOVED: after its replica
// took over, every command for its slots still went to the dead address
// and failed, and with DEDUP_FAILURE_MODE=closed the api answered 503 to a
// third of the keys for up to a minute after the failover had finished
// (TestRedisClusterFailoverRecoversAtOnce). A reload is lazy and
// coalesced (at most one CLUSTER SLOTS every 200ms), so calling it on every
// such error costs nothing while a node is down.
type reloadOnNodeLoss struct{ cc *redis.ClusterClient }

func (h reloadOnNodeLoss) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnNodeLoss) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if nodeLost(err) {
			h.cc.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnNodeLoss) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		lost := nodeLost(err)
		for _, cmd := range cmds {
			lost = lost || nodeLost(cmd.Err())
		}
		if lost {
			h.cc.ReloadState(ctx)
		}
		return err
	}
}

// nodeLost reports whether err may mean that the cluster's shape changed
// under the client: a network error or timeout (the node is gone or hung),
// or CLUSTERDOWN (a failover is under way). A reply error of the command
// itself (redis.Nil, NOSCRIPT, a script's error) and the caller's own
// cancellation do not.
func nodeLost(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) {
		return false
	}
	if redis.IsClusterDownError(err) {
		return true
	}
	var reply redis.Error
	return !errors.As(err, &reply)
}
