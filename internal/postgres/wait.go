package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
	"gorm.io/gorm"
)

// OpenRetrying opens the database, retrying with backoff (up to 5s apart) until it
// answers or ctx ends. Validate the URL first: a malformed one is retried
// like an unreachable server.
func OpenRetrying(ctx context.Context, cfg Config, logger *slog.Logger) (*gorm.DB, error) {
	b := backoff.NewExponentialBackOff()
	b.MaxInterval = 5 * time.Second
	attempt := 0
	return backoff.Retry(ctx, func() (*gorm.DB, error) {
		attempt++
		db, err := Open(ctx, cfg)
		if err != nil {
			logger.Warn("postgres not reachable, retrying", "attempt", attempt, "err", err)
		}
		return db, err
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0))
}

// SchemaReady reports an error naming the first of tables that does not
// exist yet. The API applies the migrations; the background processes only
// wait for them.
func SchemaReady(ctx context.Context, db *gorm.DB, tables ...string) error {
	for _, t := range tables {
		var exists bool
		if err := db.WithContext(ctx).Raw(`SELECT to_regclass(?) IS NOT NULL`, "public."+t).Scan(&exists).Error; err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("table %s does not exist yet (migrate, or the api at start, applies the migrations)", t)
		}
	}
	return nil
}

// WaitForSchema polls SchemaReady every second until it passes or ctx ends.
func WaitForSchema(ctx context.Context, db *gorm.DB, logger *slog.Logger, tables ...string) error {
	logged := false
	for {
		err := SchemaReady(ctx, db, tables...)
		if err == nil {
			return nil
		}
		if !logged {
			logger.Warn("waiting for the schema", "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for schema: %w (%v)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}
