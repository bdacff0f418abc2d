// Command createdb creates the database DATABASE_URL names when it is
// missing, for `make run`: the processes migrate its schema themselves, but
// PostgreSQL needs the database to exist first. DATABASE_URL is read as the
// processes read it: with their own settings (config.Shared through
// config.Load, so unset or empty means their default), then
// pgx.ParseConfig (a postgres:// URL or key=value pairs, with libpq's PG*
// variables for what it leaves out). It connects with the same settings to
// the server's `postgres` database. Exit status 1 with a message on any
// error.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/checkout/internal/config"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "createdb:", err)
		os.Exit(1)
	}
}

func run() error {
	var s config.Shared
	if err := config.Load(os.Getenv, &s); err != nil {
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
	cfg.Database = "postgres"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
	if exists {
		return nil
	}
	// CREATE DATABASE takes no parameters: the name is quoted as an identifier.
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	fmt.Printf("createdb: created database %q on %s:%d\n", name, cfg.Host, cfg.Port)
	return nil
}
