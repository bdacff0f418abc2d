package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/onceonly/checkout/internal/deadletter"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

// redrive is `worker redrive-dead-letters [-id ID] [-message ID]`: it
// sends every unresolved dead letter (or one row's, or one event's) through
// the queue it was dead-lettered from again (deadletter.Redrive), marks it
// redriven, and prints how many. Run it once the cause is fixed: a running
// worker handles each event once, since its inbox drops one it already
// processed, so running it twice sends no second email. It reads
// DATABASE_URL and AMQP_URL like the worker and exits non-zero if either
// cannot be reached or a letter could not be sent (it stays unresolved).
func redrive(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("redrive-dead-letters", flag.ContinueOnError)
	fs.SetOutput(stdout)
	id := fs.String("id", "", "send only this dead letter (dead_letters.id)")
	messageID := fs.String("message", "", "send only the dead letters of this event (message id)")
	db, s, err := openCommand(ctx, fs, args, getenv)
	if err != nil {
		return err
	}
	defer postgres.Close(db)
	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	topology := rabbitmq.NewTopology(s.Names(), nil)
	conn, err := rabbitmq.Dial(dialCtx, rabbitmq.Config{URL: s.AMQPURL, Name: "worker redrive-dead-letters",
		Prepare: topology.Prepare, Setup: topology.Declare})
	if err != nil {
		return fmt.Errorf("AMQP_URL: %w", err)
	}
	defer conn.Close()
	// The default exchange: each letter goes to the queue it died in.
	pub := rabbitmq.NewPublisher(conn, rabbitmq.PublisherConfig{Exchange: ""})
	defer pub.Close()
	n, err := deadletter.Redrive(ctx, db, pub, deadletter.Filter{ID: *id, MessageID: *messageID}, time.Now)
	fmt.Fprintf(stdout, "redrove %d dead letters\n", n)
	return err
}
