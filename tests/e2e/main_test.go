// Package e2e proves the guarantees of CONTRACT.md on the real binaries:
// each test starts its own stack (package stack) as processes, injects one
// kind of fault (a gateway 504, a SIGKILL, a Stripe failure, a cut
// connection, a lost Redis) and asserts exact counts: PaymentIntents per
// Stripe key at the emulator, orders per key, emails per order, unpublished
// outbox rows after quiescence, and the final order status.
package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/tests/e2e/stack"
)

// binDir holds the binaries, built once for the whole package.
var binDir string

func TestMain(m *testing.M) { stack.Main(m, "e2e", &binDir) }

// setup starts a stack of the test's own with opts (BinDir filled in).
func setup(t *testing.T, opts stack.Options) *stack.Stack {
	t.Helper()
	opts.BinDir = binDir
	return stack.Start(t, opts)
}

// testCtx bounds one scenario.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// untilFinal retries key with the same body until a final answer, and
// fails the test if none comes before ctx ends.
func untilFinal(ctx context.Context, t *testing.T, c *stack.Client, key string, body stack.Body) []stack.Result {
	t.Helper()
	rs, err := c.CheckoutUntilFinal(ctx, key, body, 100*time.Millisecond)
	require.NoError(t, err)
	return rs
}

// last is the final answer of rs.
func last(rs []stack.Result) stack.Result { return rs[len(rs)-1] }

// paidOrder requires r to be a 201 with a paid order and returns the order.
func paidOrder(t *testing.T, r stack.Result) *stack.Order {
	t.Helper()
	require.Equal(t, 201, r.Status, "answer: %s %s", r, r.Body)
	require.NotNil(t, r.Order)
	require.Equal(t, "paid", r.Order.Status)
	return r.Order
}

// requireOnce asserts the end state of one paid checkout of key after
// quiescence: one PaymentIntent for its Stripe key, the key finished with
// this order, the order paid, one email, no outbox row left.
func requireOnce(t *testing.T, s *stack.Stack, key string, o *stack.Order) {
	t.Helper()
	require.NoError(t, s.Quiesce(20*time.Second))
	require.Equal(t, 1, s.Charges(key, o.ID), "PaymentIntents for the key's Stripe idempotency key")
	k, ok := s.Key(key)
	require.True(t, ok)
	require.Equal(t, "finished", k.RecoveryPoint)
	require.Equal(t, o.ID, k.OrderID, "the key's one order")
	require.Equal(t, "paid", s.OrderStatus(o.ID))
	require.Equal(t, 1, s.Emails(o.ID), "emails for the order")
	require.Equal(t, 0, s.Unpublished(), "unpublished outbox rows")
}

// async runs f in a goroutine and returns a function that waits for its
// result.
func async[T any](f func() T) func() T {
	var (
		wg sync.WaitGroup
		v  T
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		v = f()
	}()
	return func() T {
		wg.Wait()
		return v
	}
}

// eventually polls cond every 20ms, on the test's goroutine (cond may use
// the stack's accessors), until it holds; it fails the test after d.
func eventually(t *testing.T, d time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: "+msg, append([]any{d}, args...)...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
