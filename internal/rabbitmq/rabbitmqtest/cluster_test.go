package rabbitmqtest_test

import (
	"context"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/rabbitmq/rabbitmqtest"
)

// TestCluster checks the harness itself: three clustered nodes, a quorum
// queue declared through the third has its leader there, and a killed
// leader is replaced by another node while the restarted one rejoins.
// It boots RabbitMQ three times over: make test-failover runs it.
func TestCluster(t *testing.T) {
	if os.Getenv("TEST_FAILOVER") == "" {
		t.Skip("set TEST_FAILOVER=1 (make test-failover): starts a 3-node RabbitMQ cluster")
	}
	c := rabbitmqtest.StartCluster(t, 3)
	conn, err := amqp.Dial(c.Nodes[2].URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("harness.q", true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", "harness.q", false, false, amqp.Publishing{Body: []byte("x")}))

	leader, err := c.QueueLeader("harness.q")
	require.NoError(t, err)
	require.Equal(t, c.Nodes[2].Name, leader.Name, "declared through node 3 (client-local leader)")
	leader.Kill()
	require.Eventually(t, func() bool {
		l, err := c.QueueLeader("harness.q")
		return err == nil && l != leader
	}, time.Minute, time.Second, "a new leader")
	require.NoError(t, leader.Restart(3*time.Minute))
	require.NoError(t, c.AwaitOnline(3, 2*time.Minute))

	conn2, err := amqp.Dial(c.Nodes[0].URL)
	require.NoError(t, err)
	defer conn2.Close()
	ch2, err := conn2.Channel()
	require.NoError(t, err)
	q, err := ch2.QueueDeclarePassive("harness.q", true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
	require.Equal(t, 1, q.Messages, "the message survived its leader")
}
