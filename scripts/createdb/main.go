// Command createdb creates the database DATABASE_URL names when it is
// missing, for `make run`: the processes migrate its schema themselves, but
// PostgreSQL needs the database to exist first. With -drop (`make dropdb`)
// it drops that database instead, when it exists: the cleanup of a stack
// run with `make run`. DATABASE_URL is read as the processes read it: with
// their own settings (config.Shared through config.Load, so unset or empty
// means their default), then pgx.ParseConfig (a postgres:// URL or
// key=value pairs, with libpq's PG* variables for what it leaves out). It
// connects with the same settings to the server's `postgres` database. Exit
// status 1 with a message on any error, among them a drop while a process
// is still connected to the database (stop `make run` first).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceonly/checkout/internal/config"
)

func main() {
	if err := run(context.Background(), os.Getenv, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "createdb:", err)
		os.Exit(1)
	}
}

// objectInUse is PostgreSQL's SQLSTATE for a DROP DATABASE of a database
// with sessions (https://www.postgresql.org/docs/current/errcodes-appendix.html).
const objectInUse = "55006"

func run(ctx context.Context, getenv func(string) string, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("createdb", flag.ContinueOnError)
	drop := fs.Bool("drop", false, "drop the database instead of creating it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var s config.Shared
	if err := config.Load(getenv, &s); err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(s.DatabaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	name := cfg.Database
	if name == "" {
		return fmt.Errorf("DATABASE_URL names no database")
	}
	if *drop && name == "postgres" {
		return fmt.Errorf("DATABASE_URL names the database postgres, the server's own: not dropped")
	}
	cfg.Database = "postgres"
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	// CREATE and DROP DATABASE take no parameters: the name is quoted as
	// an identifier.
	switch {
	case *drop && exists:
		if _, err := conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == objectInUse {
				return fmt.Errorf("drop database %q: processes are connected to it: stop `make run` first: %w", name, err)
			}
			return fmt.Errorf("drop database %q: %w", name, err)
		}
		fmt.Fprintf(stdout, "createdb: dropped database %q on %s:%d\n", name, cfg.Host, cfg.Port)
	case !*drop && !exists:
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return fmt.Errorf("create database %q: %w", name, err)
		}
		fmt.Fprintf(stdout, "createdb: created database %q on %s:%d\n", name, cfg.Host, cfg.Port)
	}
	return nil
}
