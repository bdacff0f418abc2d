package idempotency

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/testenv"
)

// echoScript returns its key and argument; the random comment gives it a
// SHA that no Redis has loaded yet, so its first EVALSHA is NOSCRIPT.
func echoScript() *redis.Script {
	return redis.NewScript("-- " + testenv.Random(8) + "\nreturn KEYS[1] .. ' ' .. ARGV[1]")
}

// Many concurrent runs, batched into shared pipelines, each get their own
// reply, never another run's.
func TestScriptBatcherAnswersEachRunItsOwnReply(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	b := &scriptBatcher{rdb: rdb, script: echoScript()}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64*50)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				key, arg := fmt.Sprintf("%sk%d", prefix, g), fmt.Sprint(i)
				got, err := b.run(ctx, []string{key}, arg).Text()
				if err == nil && got != key+" "+arg {
					err = fmt.Errorf("run %s %s got %q", key, arg, got)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	require.False(t, b.busy, "the lead was given up")
	require.Empty(t, b.queue)
}

// A pipeline whose runs find no script (a restarted or flushed Redis)
// runs them again alone, loading the script: they are answered, not
// failed with NOSCRIPT.
func TestScriptBatcherLoadsAMissingScript(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	b := &scriptBatcher{rdb: rdb, script: echoScript()}
	batch := make([]*scriptRun, 3)
	for i := range batch {
		batch[i] = &scriptRun{keys: []string{fmt.Sprintf("%sk%d", prefix, i)}, args: []any{"a"}}
	}
	b.send(context.Background(), batch)
	for i, r := range batch {
		got, err := r.cmd.Text()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("%sk%d a", prefix, i), got)
	}
}

// A Redis that does not answer fails every run of the pipeline, each with
// its own error; none hangs.
func TestScriptBatcherFailsEveryRunWhenRedisIsDown(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t)
	o, err := redis.ParseURL(rs.URL())
	require.NoError(t, err)
	o.MaxRetries = -1
	rdb := redis.NewClient(o)
	t.Cleanup(func() { rdb.Close() })
	rs.Stop()
	b := &scriptBatcher{rdb: rdb, script: echoScript()}
	var wg sync.WaitGroup
	fails := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fails <- b.run(context.Background(), []string{fmt.Sprint("k", i)}, "a").Err()
		}()
	}
	wg.Wait()
	close(fails)
	for err := range fails {
		require.Error(t, err)
	}
}
