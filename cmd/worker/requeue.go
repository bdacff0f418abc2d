package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/onceonly/checkout/internal/notify"
	"github.com/onceonly/checkout/internal/postgres"
)

// usage is the worker's command line.
const usage = `usage:
  worker                                   run the background work (the default)
  worker requeue-notifications [-order ID] send failed notifications again
  worker redrive-dead-letters [-id ID] [-message ID]
                                           send recorded dead letters through their queue again`

// dispatch runs the command args name: none runs the worker (run);
// "requeue-notifications" requeues failed notifications (requeue);
// "redrive-dead-letters" sends recorded dead letters again (redrive).
func dispatch(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 {
		return run(ctx, getenv, stdout)
	}
	switch args[0] {
	case "requeue-notifications":
		return requeue(ctx, args[1:], getenv, stdout)
	case "redrive-dead-letters":
		return redrive(ctx, args[1:], getenv, stdout)
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// requeue is `worker requeue-notifications [-order ID]`: it makes every
// failed notification (or order ID's) pending again, due now, and prints
// how many. A running worker sends them at its next sweep, each with its
// own Message-ID, once. It reads DATABASE_URL like the worker and needs
// nothing else; it exits non-zero if the database cannot be reached.
func requeue(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("requeue-notifications", flag.ContinueOnError)
	fs.SetOutput(stdout)
	orderID := fs.String("order", "", "requeue only this order's failed notifications (default: every failed one)")
	db, _, err := openCommand(ctx, fs, args, getenv)
	if err != nil {
		return err
	}
	defer postgres.Close(db)
	n, err := notify.Requeue(ctx, db, *orderID)
	if err != nil {
		return err
	}
	if *orderID != "" {
		fmt.Fprintf(stdout, "requeued %d failed notifications of order %s\n", n, *orderID)
	} else {
		fmt.Fprintf(stdout, "requeued %d failed notifications\n", n)
	}
	return nil
}
