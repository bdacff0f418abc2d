package main

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisClient returns a constructor of the client REDIS_URL names, parsed
// now so that a bad value stops the process before anything starts.
//
// Without REDIS_CLUSTER it is one server (redis.ParseURL:
// redis://[user:password@]host:port/db). With REDIS_CLUSTER=true it is a
// Redis Cluster (redis.ParseClusterURL): REDIS_URL's host and every addr
// query parameter are seed nodes, e.g.
// redis://10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000, from which the
// client learns the cluster's slots and follows its MOVED and ASK
// redirections. A cluster has only database 0. The service works the same
// on both: every script it runs touches the keys of one hash tag (an
// idempotency key's lease and response, a tenant's rate buckets), which
// one slot holds.
//
// Short timeouts either way: Redis is an accelerator; a hung Redis must
// turn into DEDUP_FAILURE_MODE quickly, not into a hung checkout.
func redisClient(rawURL string, cluster bool) (func() redis.UniversalClient, error) {
	const (
		dial       = time.Second
		readWrite  = 500 * time.Millisecond
		maxRetries = 1
	)
	if !cluster {
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
	return func() redis.UniversalClient { return redis.NewClusterClient(o) }, nil
}
