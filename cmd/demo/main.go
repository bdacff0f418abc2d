// Command demo walks through the checkout service against a running stack
// (make run, or docker compose up) with the public client package: a
// checkout, its replay, a 422, the order, its outbox events and its one
// email; a partial refund, its replay, a refund beyond what is left and the
// refund email; then a 3D Secure checkout settled by Stripe's webhook. It
// exits 1 at the first step whose outcome is not the expected one.
//
// Environment (the defaults serve both stacks):
//
//	API           the api, default http://127.0.0.1:8080
//	API_KEY       the tenant's key, default sk_test_acme
//	SINK          the SMTP sink's HTTP side, default http://127.0.0.1:8025:
//	              make run's cmd/smtp-sink (GET /messages) or compose's
//	              Mailpit (its /api/v1), told apart by asking
//	EMU           the Stripe emulator, default http://127.0.0.1:12111
//	NO_COLOR      set: no bold step titles (they are bold only on a terminal)
//	DATABASE_URL  the stack's database, for the outbox; default by the stack
//	              the sink says it is: make run's
//	              postgres://postgres@127.0.0.1:5432/checkout, compose's
//	              postgres://postgres@127.0.0.1:${CHECKOUT_POSTGRES_PORT:-15432}/checkout
//
// CHECKOUT_POSTGRES_PORT, when the environment does not set it, comes from the
// .env beside docker-compose.yml, as compose takes it.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	getenv := os.Getenv
	if wd, err := os.Getwd(); err == nil {
		if getenv, err = withComposeEnv(os.Getenv, wd); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
	}
	if err := run(ctx, getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// run runs every step and returns the first failure.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg := loadConfig(getenv)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	d, err := newDemo(ctx, cfg, stdout)
	if err != nil {
		return err
	}
	for _, step := range []func(context.Context) error{d.checkout, d.email, d.outbox, d.refund, d.threeDSecure} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}
