package rabbitmq_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/rabbitmq"
	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
	"github.com/onceonly/checkout/internal/testenv"
)

func TestParseURLs(t *testing.T) {
	t.Parallel()
	got, err := rabbitmq.ParseURLs("amqp://u:p@a:5672/, amqp://u:p@b:5672/vh ,amqps://u:p@c/")
	require.NoError(t, err)
	require.Equal(t, []string{"amqp://u:p@a:5672/", "amqp://u:p@b:5672/vh", "amqps://u:p@c/"}, got)

	_, err = rabbitmq.ParseURLs("amqp://u:secret@a:5672/,,amqp://u:p@b/")
	require.ErrorContains(t, err, "url 2 of 3 is empty")
	_, err = rabbitmq.ParseURLs("amqp://u:secret@a:5672/,http://u:secret@b/")
	require.ErrorContains(t, err, "url 2 of 2")
	require.NotContains(t, err.Error(), "secret", "an error never shows a URL's password")
}

// TestConnFollowsTheNodesOfItsURLList: with several URLs the Conn connects
// to the first that answers (the first here refuses), and when that node
// goes away it reconnects to another, without a restart. The two
// "nodes" are proxies to the one local broker; the second one's closing
// is a node's death as a client sees it (connections cut, new ones
// refused). Without the list, the Conn would retry the dead node forever.
func TestConnFollowsTheNodesOfItsURLList(t *testing.T) {
	t.Parallel()
	f := setup(t)
	dead := "amqp://guest:guest@127.0.0.1:" + itoa(testenv.FreePort(t)) + "/"
	nodeA := rabbitmqtest.NewProxy(t, brokerHostPort(t))
	nodeB := rabbitmqtest.NewProxy(t, brokerHostPort(t))
	logs := &testenv.Output{}
	conn := rabbitmqtest.Dial(t, strings.Join([]string{dead, proxiedURL(t, nodeA), proxiedURL(t, nodeB)}, ","), func(c *rabbitmq.Config) {
		c.Logger = newLogger(logs)
	})
	require.Equal(t, proxyHostPort(nodeA), testenv.LogValue(t, logs, "rabbitmq: connected", "node"), "the first node that answers")

	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: f.names.Exchange, ConfirmTimeout: 2 * time.Second})
	defer pub.Close()
	require.Equal(t, []error{nil}, pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_before")}))

	nodeA.Close() // the node dies: its connections cut, new ones refused
	eventually(t, 10*time.Second, func() bool {
		return pub.Publish(context.Background(), []rabbitmq.Message{paid("evt_after")})[0] == nil
	}, "publish through another node")
	require.Equal(t, 1, nodeB.CutAll(), "the Conn moved to the node that answers")
	require.Equal(t, 2, queueDepth(t, f, f.names.NotifyQueue))
}

// TestMigrateDLQReplacesAnEmptyClassicDLQ: a broker where an older version
// declared the dead-letter queue as a classic queue refuses the quorum
// declaration (PRECONDITION_FAILED); MigrateDLQ, run as Config.Prepare,
// replaces it when it is empty, and the topology then declares as usual.
// Without it every connection attempt fails, forever.
func TestMigrateDLQReplacesAnEmptyClassicDLQ(t *testing.T) {
	t.Parallel()
	names := classicDLQNames(t, 0)
	conn := dialWithMigration(t, names, 10*time.Second)
	require.NoError(t, conn.Ping(context.Background()))

	ch, err := conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(names.NotifyDLQ, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err, "the DLQ is a quorum queue now")
	require.NoError(t, rabbitmq.DeclareTopology(ch, names))
}

// TestMigrateDLQRefusesAClassicDLQWithMessages: a classic DLQ that holds
// messages (poison events an operator must see) is left alone, message
// and all, and Dial fails at once with an error that names the queue and
// its count, not after retrying until its context ends.
func TestMigrateDLQRefusesAClassicDLQWithMessages(t *testing.T) {
	t.Parallel()
	names := classicDLQNames(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := rabbitmq.Dial(ctx, rabbitmq.Config{URL: rabbitmqtest.URL(), MinBackoff: 20 * time.Millisecond,
		Prepare: func(c *amqp.Connection) error { return rabbitmq.MigrateDLQ(c, names, nil) },
		Setup:   func(ch *amqp.Channel) error { return rabbitmq.DeclareTopology(ch, names) }})
	require.ErrorIs(t, err, rabbitmq.ErrPermanent)
	require.ErrorContains(t, err, names.NotifyDLQ)
	require.ErrorContains(t, err, "holds 2 messages")
	require.Less(t, time.Since(start), 10*time.Second, "no retries")

	conn := rabbitmqtest.Dial(t, rabbitmqtest.URL())
	ch, err := conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(names.NotifyDLQ, true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, 2, q.Messages, "the poison messages are kept")
}

// classicDLQNames returns a topology of the test's own whose DLQ exists as
// a classic queue holding n messages, as a pre-v3 version left it; the
// queues and exchange are deleted at the end.
func classicDLQNames(t *testing.T, n int) rabbitmq.Names {
	t.Helper()
	names := rabbitmq.DefaultNames().WithPrefix("test." + testenv.Random(6) + ".")
	conn := rabbitmqtest.Dial(t, rabbitmqtest.URL())
	ch, err := conn.Channel(context.Background())
	require.NoError(t, err)
	defer ch.Close()
	_, err = ch.QueueDeclare(names.NotifyDLQ, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic})
	require.NoError(t, err)
	for i := range n {
		require.NoError(t, ch.PublishWithContext(context.Background(), "", names.NotifyDLQ, false, false,
			amqp.Publishing{MessageId: "evt_poison_" + itoa(i), Body: []byte("{}")}))
	}
	t.Cleanup(func() {
		c, err := rabbitmq.Dial(context.Background(), rabbitmq.Config{URL: rabbitmqtest.URL()})
		if err != nil {
			return
		}
		defer c.Close()
		ch, err := c.Channel(context.Background())
		if err != nil {
			return
		}
		defer ch.Close()
		_ = rabbitmq.DeleteTopology(ch, names)
	})
	// A publish without confirms: wait until the broker counts them.
	eventually(t, 5*time.Second, func() bool {
		c, err := conn.Channel(context.Background())
		if err != nil {
			return false
		}
		defer c.Close()
		q, err := c.QueueDeclarePassive(names.NotifyDLQ, true, false, false, false, nil)
		return err == nil && q.Messages == n
	}, "%d messages in the classic DLQ", n)
	return names
}

// dialWithMigration dials as daemon.Deps.Open does: MigrateDLQ, then the
// topology.
func dialWithMigration(t *testing.T, names rabbitmq.Names, within time.Duration) *rabbitmq.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, rabbitmq.Config{URL: rabbitmqtest.URL(), MinBackoff: 20 * time.Millisecond,
		Prepare: func(c *amqp.Connection) error { return rabbitmq.MigrateDLQ(c, names, nil) },
		Setup:   func(ch *amqp.Channel) error { return rabbitmq.DeclareTopology(ch, names) }})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func proxyHostPort(p *rabbitmqtest.Proxy) string { return p.Addr() }

func itoa(i int) string { return strconv.Itoa(i) }

// newLogger logs JSON to out, for testenv.LogValue.
func newLogger(out *testenv.Output) *slog.Logger {
	return slog.New(slog.NewJSONHandler(out, nil))
}
