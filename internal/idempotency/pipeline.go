package idempotency

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// scriptBatcher sends the runs of one script by concurrent requests to
// Redis together: while one pipeline is out, the runs that arrive queue,
// and the first of them, once the pipeline is answered, sends all that
// queued in the next one. Under load a request's Redis round trip then
// shares its write and its reads (system calls, and the wakeups behind
// them) with the others'; alone, a request sends a pipeline of one, at
// once. Each run is still its own EVALSHA, atomic in Redis and answered on
// its own: batching changes how the commands travel, not what they do.
type scriptBatcher struct {
	rdb    redis.UniversalClient
	script *redis.Script

	mu    sync.Mutex
	busy  bool // a pipeline is out, or being sent
	queue []*scriptRun
}

// scriptRun is one queued run and, once done is signalled, its reply.
type scriptRun struct {
	keys []string
	args []any
	cmd  *redis.Cmd
	// done carries false when cmd is answered, true when this run is
	// handed the lead: it is to send the queue (itself included).
	done chan bool
}

// run runs the script with keys and args and returns its reply, as
// script.Run would (EVALSHA, and EVAL when Redis does not have the script).
func (b *scriptBatcher) run(ctx context.Context, keys []string, args ...any) *redis.Cmd {
	me := &scriptRun{keys: keys, args: args, done: make(chan bool, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, me)
	if b.busy {
		b.mu.Unlock()
		if lead := <-me.done; !lead {
			return me.cmd
		}
		b.mu.Lock()
	}
	b.busy = true
	batch := b.queue
	b.queue = nil
	b.mu.Unlock()

	b.send(ctx, batch)
	for _, r := range batch {
		if r != me {
			r.done <- false
		}
	}
	// Hand the lead to the first run that queued meanwhile, so that no
	// request keeps sending others' pipelines while its own answer waits.
	b.mu.Lock()
	if len(b.queue) > 0 {
		next := b.queue[0]
		b.mu.Unlock()
		next.done <- true
	} else {
		b.busy = false
		b.mu.Unlock()
	}
	return me.cmd
}

// send runs batch in one pipeline and sets each run's cmd. A run that
// found no script in Redis (NOSCRIPT: a restarted or flushed Redis) did
// not execute, and runs again alone through script.Run, which loads it.
func (b *scriptBatcher) send(ctx context.Context, batch []*scriptRun) {
	if len(batch) == 1 {
		batch[0].cmd = b.script.Run(ctx, b.rdb, batch[0].keys, batch[0].args...)
		return
	}
	pipe := b.rdb.Pipeline()
	for _, r := range batch {
		r.cmd = b.script.EvalSha(ctx, pipe, r.keys, r.args...)
	}
	_, _ = pipe.Exec(ctx) // each cmd holds its own reply or error
	for _, r := range batch {
		if err := r.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			r.cmd = b.script.Run(ctx, b.rdb, r.keys, r.args...)
		}
	}
}
