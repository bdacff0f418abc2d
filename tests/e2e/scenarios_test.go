package e2e

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/checkout"
	"github.com/onceonly/checkout/internal/idempotency"
	"github.com/onceonly/checkout/internal/stripeemu"
	"github.com/onceonly/checkout/internal/stripestep"
	"github.com/onceonly/checkout/internal/testenv"
	"github.com/onceonly/checkout/tests/e2e/stack"
)

// Scenario 1: Stripe is slow, the gateway gives up first and answers 504,
// but the api finishes the checkout. The client retries with the same key
// until it gets its 201: one charge, one order, the same order.
func TestGatewayTimeoutAfterCommitRetrySameKey(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{GatewayTimeout: time.Second})
	ctx := testCtx(t, 60*time.Second)
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, After: 2500 * time.Millisecond})

	rs := untilFinal(ctx, t, s.Client(), "k-504", stack.TeeBody("a@example.com", 2))
	require.Equal(t, 504, rs[0].Status, "the first attempt times out at the gateway")
	o := paidOrder(t, last(rs))
	require.True(t, last(rs).Replayed, "the 201 the client finally sees is the stored one")
	requireOnce(t, s, "k-504", o)
	require.Equal(t, 1, s.Orders())
}

// Scenario 2: the same 504, but the client mints a new key for its retry.
// The service cannot know it is the same purchase: two orders, two charges.
// This is why a retry must keep its key.
func TestNewKeyPerRetryChargesTwice(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{GatewayTimeout: time.Second})
	ctx := testCtx(t, 60*time.Second)
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, After: 2500 * time.Millisecond})
	c := s.Client()
	body := stack.TeeBody("b@example.com", 1)

	first := c.Checkout(ctx, "k-new-1", body)
	require.Equal(t, 504, first.Status)
	second := paidOrder(t, last(untilFinal(ctx, t, c, "k-new-2", body)))
	eventually(t, 15*time.Second, func() bool { k, _ := s.Key("k-new-1"); return k.RecoveryPoint == "finished" },
		"the timed-out request finishes on its own")

	k1, _ := s.Key("k-new-1")
	require.NotEqual(t, second.ID, k1.OrderID)
	require.NoError(t, s.Quiesce(20*time.Second))
	require.Equal(t, 2, s.Orders(), "one order per key: two orders for one purchase")
	require.Equal(t, 2, s.Stats().PaymentIntentsCreated, "the buyer is charged twice")
	require.Equal(t, 1, s.Charges("k-new-1", k1.OrderID))
	require.Equal(t, 1, s.Charges("k-new-2", second.ID))
	require.Equal(t, "paid", s.OrderStatus(k1.OrderID))
	require.Len(t, s.Messages(), 2)
}

// Scenario 3: the api is SIGKILLed after transaction 1 committed, while
// Stripe is still executing the charge (delay before executing). After a
// restart, a retry waits for the dead owner's lease to expire, takes the
// key over at order_created and calls Stripe with the same key: one charge.
func TestAPIKilledBeforeStripeAnswered(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{Lease: 2 * time.Second})
	ctx := testCtx(t, 60*time.Second)
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 3 * time.Second})
	body := stack.TeeBody("c@example.com", 1)

	wait := async(func() stack.Result { return s.DirectClient().Checkout(ctx, "k-kill-1", body) })
	eventually(t, 10*time.Second, func() bool { return s.Stats().InFlight == 1 }, "Stripe executing the charge")
	s.API.Kill()
	require.Equal(t, 0, wait().Status, "the killed api answered nothing")
	k, ok := s.Key("k-kill-1")
	require.True(t, ok)
	require.Equal(t, checkout.RecoveryPointOrderCreated, k.RecoveryPoint)
	require.Equal(t, "pending_payment", s.OrderStatus(k.OrderID))

	require.NoError(t, s.API.Start())
	rs := untilFinal(ctx, t, s.Client(), "k-kill-1", body)
	o := paidOrder(t, last(rs))
	require.Equal(t, k.OrderID, o.ID, "the retry resumed the order of transaction 1")
	requireOnce(t, s, "k-kill-1", o)
	require.Equal(t, 1, s.Orders())
	require.Equal(t, 1, s.Stats().PaymentIntentsCreated)
}

// Scenario 4: the api is SIGKILLed after Stripe charged but before
// transaction 2 (the emulator delays its answer after executing). The retry
// resumes and Stripe replays the same PaymentIntent.
func TestAPIKilledAfterStripeCharged(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{Lease: 2 * time.Second})
	ctx := testCtx(t, 60*time.Second)
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, After: 3 * time.Second})
	body := stack.TeeBody("d@example.com", 1)

	wait := async(func() stack.Result { return s.DirectClient().Checkout(ctx, "k-kill-2", body) })
	eventually(t, 10*time.Second, func() bool { return s.Stats().PaymentIntentsCreated == 1 }, "Stripe charged")
	s.API.Kill()
	require.Equal(t, 0, wait().Status)
	pi := s.Stats().Requests[0].PaymentIntentID
	require.NotEmpty(t, pi)
	k, _ := s.Key("k-kill-2")
	require.Equal(t, checkout.RecoveryPointOrderCreated, k.RecoveryPoint, "transaction 2 never ran")

	require.NoError(t, s.API.Start())
	o := paidOrder(t, last(untilFinal(ctx, t, s.Client(), "k-kill-2", body)))
	require.Equal(t, pi, o.Payment.PaymentIntentID, "the charge made before the crash")
	requireOnce(t, s, "k-kill-2", o)
	require.Equal(t, 1, s.Stats().PaymentIntentsCreated)
}

// Scenario 5: Stripe's transient failures are retried inside one request
// with the same Stripe key: 500 twice then success; a timeout although the
// charge was made; 409 idempotency_key_in_use while the first call still
// runs. Each time: one charge, the order never marked failed, no new key.
func TestStripeTransientFailures(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{StripeTimeout: time.Second, StripeMaxElapsed: 15 * time.Second})
	ctx := testCtx(t, 90*time.Second)

	for _, tc := range []struct {
		name  string
		fault stripeemu.Fault
		// want is what the emulator's log must show for the create step's
		// first key.
		want func(t *testing.T, statuses []int, replays int)
		// answers is how many answers the client needs at least (a stored
		// 500 is reconciled only once the search index has settled: 502s
		// until then).
		answers int
	}{
		{"503 twice then success", stripeemu.Fault{Kind: stripeemu.FaultFail, Op: stripeemu.OpPICreate, Count: 2, Status: 503},
			func(t *testing.T, st []int, _ int) { require.Equal(t, []int{503, 503, 200}, st) }, 1},
		{"timeout although created", stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, After: 1500 * time.Millisecond},
			func(t *testing.T, st []int, replays int) {
				require.GreaterOrEqual(t, len(st), 2)
				require.Equal(t, len(st)-1, replays, "every attempt after the timed-out one is a replay")
			}, 1},
		{"409 in use while the first call runs", stripeemu.Fault{Kind: stripeemu.FaultDelay, Op: stripeemu.OpPICreate, Count: 1, Before: 2500 * time.Millisecond},
			func(t *testing.T, st []int, _ int) { require.Contains(t, st, 409) }, 1},
		{"stored 500 never resent", stripeemu.Fault{Kind: stripeemu.FaultStored500, Op: stripeemu.OpPICreate, Count: 1},
			func(t *testing.T, st []int, _ int) {
				require.Equal(t, []int{500}, st, "a stored 500 is reconciled, not resent")
			}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-stripe-" + strings.ReplaceAll(tc.name, " ", "-")
			s.Fault(tc.fault)
			rs := untilFinal(ctx, t, s.DirectClient(), key, stack.TeeBody("e@example.com", 1))
			if tc.answers == 1 {
				require.Len(t, rs, 1, "the api absorbed the failure: %v", rs)
			}
			require.GreaterOrEqual(t, len(rs), tc.answers, "answers: %v", rs)
			for _, r := range rs[:len(rs)-1] {
				require.Equal(t, 502, r.Status, "answers: %v", rs)
				require.Equal(t, "payment_provider_unavailable", r.Code)
			}
			o := paidOrder(t, last(rs))

			var statuses []int
			replays := 0
			for _, r := range s.Stats().Requests {
				if !strings.HasPrefix(r.IdempotencyKey, o.ID+"/") && !strings.Contains(r.Params, o.ID) {
					continue
				}
				require.True(t, r.Method != "POST" || strings.HasPrefix(r.IdempotencyKey, o.ID+"/"),
					"every Stripe write carries a key derived from the order: %q", r.IdempotencyKey)
				if r.IdempotencyKey != stack.StepKey(o.ID, stripestep.StepCreate) {
					continue
				}
				statuses = append(statuses, r.Status)
				if r.Replayed {
					replays++
				}
			}
			tc.want(t, statuses, replays)
			requireOnce(t, s, key, o)
			require.Zero(t, s.Count(`SELECT count(*) FROM orders WHERE status <> 'paid'`), "no order marked failed")
		})
	}
	require.Equal(t, 4, s.Stats().PaymentIntentsCreated)
}

// Scenario 6: a request slower than its lease keeps it by extension: a
// duplicate meanwhile gets 409, and when the slow request ends, its release
// (compare-and-set on its owner token) leaves a lease someone else holds.
func TestSlowRequestKeepsItsLease(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{Lease: time.Second})
	ctx := testCtx(t, 60*time.Second)
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 4 * time.Second})
	const key = "k-slow"
	body := stack.TeeBody("f@example.com", 1)

	wait := async(func() stack.Result { return s.DirectClient().Checkout(ctx, key, body) })
	// Extended twice in Postgres: the lease outlived two of its terms.
	eventually(t, 10*time.Second, func() bool {
		return s.Count(`SELECT count(*) FROM idempotency_keys
			WHERE key = $1 AND lease_expires_at > created_at + interval '2 seconds'`, key) == 1
	}, "the Postgres lease is extended")
	dup := s.DirectClient().Checkout(ctx, key, body)
	require.Equal(t, 409, dup.Status)
	require.Equal(t, "idempotency_key_in_use", dup.Code)

	// Plant another owner's Redis lease, as if the slow request had lost it
	// to a takeover; its release must not delete it.
	rdb, _ := testenv.Redis(t)
	leaseKey := s.RedisPrefix + "idem:{" + idempotency.Scope{Tenant: stack.Tenant, Route: checkout.Route, Key: key}.Hash() + "}:lease"
	require.Equal(t, int64(1), rdb.Exists(ctx, leaseKey).Val(), "the slow request holds its Redis lease")
	require.NoError(t, rdb.Set(ctx, leaseKey, "someone-else x", 30*time.Second).Err())

	o := paidOrder(t, wait())
	require.False(t, wait().Replayed)
	require.Equal(t, "someone-else x", rdb.Get(ctx, leaseKey).Val(), "release deleted another owner's lease")
	ext, err := stack.Metric(s.APIURL+"/metrics", "checkout_idempotency_lease_extensions_total", `store="postgres"`)
	require.NoError(t, err)
	require.GreaterOrEqual(t, ext, 2.0)
	require.NoError(t, rdb.Del(ctx, leaseKey).Err())

	again := untilFinal(ctx, t, s.DirectClient(), key, body)
	require.True(t, last(again).Replayed)
	require.Equal(t, o.ID, paidOrder(t, last(again)).ID)
	requireOnce(t, s, key, o)
}

// Scenario 7: 50 concurrent duplicates through the gateway, each retrying
// until it gets a final answer: all see the same order, one charge.
func TestConcurrentDuplicatesThroughGateway(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{GatewayTimeout: 2 * time.Second})
	ctx := testCtx(t, 60*time.Second)
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: time.Second})
	const key = "k-storm"
	body := stack.TeeBody("g@example.com", 3)

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ids  = map[string]int{}
		errs []error
	)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs, err := s.Client().CheckoutUntilFinal(ctx, key, body, 100*time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if r := last(rs); r.Order != nil {
				ids[r.Order.ID]++
			} else {
				ids[r.String()]++
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	require.Len(t, ids, 1, "every duplicate sees the same answer: %v", ids)
	k, _ := s.Key(key)
	require.Equal(t, 50, ids[k.OrderID])
	o := &stack.Order{ID: k.OrderID}
	requireOnce(t, s, key, o)
	require.Equal(t, 1, s.Orders())
	require.Equal(t, 1, s.Stats().PaymentIntentsCreated)
	dups, err := stack.Metric(s.APIURL+"/metrics", "checkout_idempotency_duplicates_total")
	require.NoError(t, err)
	require.GreaterOrEqual(t, dups, 49.0, "the 49 others were absorbed as duplicates")
}

// Scenario 8: Redis is lost. In closed mode a checkout answers 503 while
// it is down; SIGKILLed and restarted empty in the middle of a request, its
// lease is gone but Postgres still refuses the duplicate; flushed, the
// replay comes from Postgres. No duplicate effect.
func TestRedisLoss(t *testing.T) {
	t.Parallel()
	r := testenv.StartRedis(t)
	s := setup(t, stack.Options{RedisAddr: r.Addr})
	ctx := testCtx(t, 60*time.Second)
	c := s.DirectClient()
	body := stack.TeeBody("h@example.com", 1)

	// Down: closed mode refuses, nothing is stored.
	r.Stop()
	down := c.Checkout(ctx, "k-redis-1", body)
	require.Equal(t, 503, down.Status, "%s", down.Body)
	require.Equal(t, "unavailable", down.Code)
	require.Zero(t, s.Orders())
	r.Restart(t)
	o1 := paidOrder(t, last(untilFinal(ctx, t, c, "k-redis-1", body)))

	// Killed and restarted empty while a request runs.
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, Before: 2 * time.Second})
	wait := async(func() stack.Result { return c.Checkout(ctx, "k-redis-2", body) })
	eventually(t, 10*time.Second, func() bool { return s.Stats().InFlight == 1 }, "the request reached Stripe")
	r.Restart(t)
	eventually(t, 10*time.Second, func() bool {
		dup := c.Checkout(ctx, "k-redis-2", body)
		require.NotEqual(t, 201, dup.Status, "a duplicate executed while the first still runs")
		return dup.Status == 409 && dup.Code == "idempotency_key_in_use"
	}, "Postgres refuses the duplicate the empty Redis let through")
	o2 := paidOrder(t, wait())
	again := last(untilFinal(ctx, t, c, "k-redis-2", body))
	require.True(t, again.Replayed)
	require.Equal(t, o2.ID, again.Order.ID)

	// Flushed: the replay comes from Postgres, byte for byte.
	first := last(untilFinal(ctx, t, c, "k-redis-1", body))
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	require.NoError(t, rdb.FlushAll(ctx).Err())
	replay := last(untilFinal(ctx, t, c, "k-redis-1", body))
	require.True(t, replay.Replayed)
	require.Equal(t, first.Body, replay.Body)
	require.Equal(t, o1.ID, replay.Order.ID)

	requireOnce(t, s, "k-redis-1", o1)
	requireOnce(t, s, "k-redis-2", o2)
	require.Equal(t, 2, s.Orders())
	require.Equal(t, 2, s.Stats().PaymentIntentsCreated)
}

// Scenario 9: the api's Postgres connections are cut after Stripe charged,
// before transaction 2 could commit. The request fails with 503 (nothing
// stored); the retry, once the lease has expired, completes it once.
func TestPostgresCutDuringTransaction2(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{Lease: 2 * time.Second})
	ctx := testCtx(t, 60*time.Second)
	s.Fault(stripeemu.Fault{Kind: stripeemu.FaultDelay, Count: 1, After: 1500 * time.Millisecond})
	const key = "k-pg-cut"
	body := stack.TeeBody("i@example.com", 1)

	wait := async(func() stack.Result { return s.DirectClient().Checkout(ctx, key, body) })
	eventually(t, 10*time.Second, func() bool { return s.Stats().PaymentIntentsCreated == 1 }, "Stripe charged")
	s.PGAPI.Cut()
	failed := wait()
	require.Contains(t, []int{502, 503}, failed.Status, "%s", failed.Body)
	k, _ := s.Key(key)
	require.Equal(t, checkout.RecoveryPointOrderCreated, k.RecoveryPoint, "transaction 2 did not commit")
	require.NoError(t, s.PGAPI.Restore())

	o := paidOrder(t, last(untilFinal(ctx, t, s.Client(), key, body)))
	require.Equal(t, k.OrderID, o.ID)
	require.Equal(t, s.Stats().Requests[0].PaymentIntentID, o.Payment.PaymentIntentID)
	requireOnce(t, s, key, o)
	require.Equal(t, 1, s.Stats().PaymentIntentsCreated)
}

// Scenario 10: the broker side. The broker connections cut: checkouts do
// not notice, events wait in the outbox. The dispatcher SIGKILLed between
// publish and mark: the event is published again and the inbox absorbs it.
// The worker SIGKILLed after its commit, before its ack: the message is
// redelivered and absorbed. One email each time.
func TestBrokerFaults(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{GatewayTimeout: 3 * time.Second})
	ctx := testCtx(t, 120*time.Second)
	c := s.Client()

	t.Run("broker connections cut", func(t *testing.T) {
		s.AMQPDispatcher.Cut()
		s.AMQPWorker.Cut()
		o := paidOrder(t, c.Checkout(ctx, "k-amqp-cut", stack.TeeBody("j@example.com", 1)))
		require.Positive(t, s.Unpublished(), "the events wait in the outbox")
		require.NoError(t, s.AMQPDispatcher.Restore())
		require.NoError(t, s.AMQPWorker.Restore())
		requireOnce(t, s, "k-amqp-cut", o)
	})

	t.Run("dispatcher killed between publish and mark", func(t *testing.T) {
		// Every frame from the broker to the dispatcher takes 1.5s, so the
		// published batch waits seconds for its confirms, unmarked (the
		// relay's mark needs no Postgres round trip after the confirms any
		// more, only its commit: a delay on Postgres's replies no longer
		// holds the batch open).
		require.NoError(t, s.AMQPDispatcher.Latency(1500))
		o := paidOrder(t, c.Checkout(ctx, "k-dispatcher-kill", stack.TeeBody("k@example.com", 1)))
		eventually(t, 20*time.Second, func() bool {
			return s.Count(`SELECT count(*) FROM outbox o JOIN inbox i ON i.message_id = o.id
				WHERE o.aggregate_id = $1 AND o.type = 'order.paid' AND o.published_at IS NULL`, o.ID) == 1
		}, "order.paid consumed by the worker but not marked published")
		s.Dispatcher.Kill()
		s.AMQPDispatcher.Heal()
		require.NoError(t, s.Dispatcher.Start())
		requireOnce(t, s, "k-dispatcher-kill", o)
		eventually(t, 10*time.Second, func() bool {
			n, err := stack.Metric(s.WorkerOps+"/metrics", "checkout_inbox_duplicates_total", "consumer", "notify.order_paid")
			return err == nil && n >= 1
		}, "the re-published order.paid reached the worker and was absorbed")
	})

	t.Run("worker killed before its ack", func(t *testing.T) {
		// The worker's commit is applied at once but its reply takes 600ms:
		// that is the window between commit and ack. Every other reply takes
		// as long, and the batch of an order's two sequenced events is about
		// ten round trips, which must fit the consumer's 15s handler
		// timeout with the sender, the completer and the reconciler also
		// waiting on the same proxy (at 1s a reply, a loaded machine timed
		// the batch out, again and again).
		require.NoError(t, s.PGWorker.Latency(600))
		o := paidOrder(t, c.Checkout(ctx, "k-worker-kill", stack.TeeBody("l@example.com", 1)))
		eventually(t, 40*time.Second, func() bool {
			return s.Count(`SELECT count(*) FROM outbox o JOIN inbox i ON i.message_id = o.id
				WHERE o.aggregate_id = $1 AND o.type = 'order.paid'`, o.ID) == 1
		}, "the worker committed its inbox row")
		s.Worker.Kill()
		s.PGWorker.Heal()
		require.Zero(t, s.Emails(o.ID), "killed before it could send")
		require.NoError(t, s.Worker.Start())
		// The dying worker's sender may have claimed the notification in
		// that second (its claim is applied at once too): then it is sent
		// once the claim expires (the sender's ClaimTTL, 60s), never twice.
		eventually(t, 75*time.Second, func() bool { return s.Emails(o.ID) >= 1 }, "the email sent after the restart")
		requireOnce(t, s, "k-worker-kill", o)
	})
	require.Len(t, s.Messages(), 3)
}

// Scenario 11: after IDEMPOTENCY_TTL the key is forgotten, and the same key
// is a new request: a new order and a new charge under a new Stripe key.
func TestKeyReusedAfterTTL(t *testing.T) {
	t.Parallel()
	s := setup(t, stack.Options{Lease: 500 * time.Millisecond, TTL: 2 * time.Second})
	ctx := testCtx(t, 60*time.Second)
	c := s.DirectClient()
	const key = "k-ttl"
	body := stack.TeeBody("m@example.com", 1)

	o1 := paidOrder(t, last(untilFinal(ctx, t, c, key, body)))
	replay := last(untilFinal(ctx, t, c, key, body))
	require.True(t, replay.Replayed)
	require.Equal(t, o1.ID, replay.Order.ID)
	eventually(t, 10*time.Second, func() bool {
		return s.Count(`SELECT count(*) FROM idempotency_keys WHERE key = $1 AND expires_at < now()`, key) == 1
	}, "the key's retention ends")

	fresh := last(untilFinal(ctx, t, c, key, body))
	require.False(t, fresh.Replayed, "past its TTL the key is new")
	o2 := paidOrder(t, fresh)
	require.NotEqual(t, o1.ID, o2.ID)
	require.NoError(t, s.Quiesce(20*time.Second))
	require.Equal(t, 2, s.Orders())
	require.Equal(t, 1, s.Charges(key, o1.ID))
	require.Equal(t, 1, s.Charges(key, o2.ID))
	require.Equal(t, 1, s.Emails(o1.ID))
	require.Equal(t, 1, s.Emails(o2.ID))
	require.Equal(t, 0, s.Unpublished())
}
