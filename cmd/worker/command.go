package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"gorm.io/gorm"

	"github.com/onceonly/checkout/internal/config"
	"github.com/onceonly/checkout/internal/postgres"
	"github.com/onceonly/checkout/internal/rabbitmq"
)

// commandSettings is what the worker's one-shot commands read of the
// worker's environment: DATABASE_URL and the RabbitMQ settings (AMQP_URL
// and the topology's names), so a command acts on the stack its worker
// runs on.
type commandSettings struct {
	config.Shared
	rabbitmq.Settings
}

// openCommand parses args into fs (a command takes flags only), loads and
// checks the settings from getenv, and opens the database with one
// connection; the caller closes it with postgres.Close. Errors: a bad flag
// or argument, a setting that fails its check, or a database that cannot
// be reached (wrapped with DATABASE_URL).
func openCommand(ctx context.Context, fs *flag.FlagSet, args []string, getenv func(string) string) (*gorm.DB, commandSettings, error) {
	var s commandSettings
	if err := fs.Parse(args); err != nil {
		return nil, s, err
	}
	if fs.NArg() > 0 {
		return nil, s, fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())
	}
	if err := config.Load(getenv, &s); err != nil {
		return nil, s, err
	}
	if errs := append(s.Shared.Check(), s.Settings.Check()...); len(errs) > 0 {
		return nil, s, errors.Join(errs...)
	}
	db, err := postgres.Open(ctx, postgres.Config{URL: s.DatabaseURL, MaxConns: 1})
	if err != nil {
		return nil, s, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return db, s, nil
}
