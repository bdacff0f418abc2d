package idempotency_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func redisClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(url)
	require.NoError(t, err)
	o.DialTimeout, o.ReadTimeout, o.MaxRetries = 200*time.Millisecond, 200*time.Millisecond, 0
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}
