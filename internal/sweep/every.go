package sweep

import (
	"context"
	"log/slog"
	"time"
)

// Every runs round at once and then every interval until ctx ends, and
// returns nil after the round in flight: the ticker of every maintenance
// loop (the completer, the reconcilers, the reaper, notify's release of
// overdue parked events). A round's error is logged as "{name} round" and
// retried in the next round; it never ends the loop, so a database or
// Stripe outage only delays the maintenance it blocks.
func Every(ctx context.Context, interval time.Duration, logger *slog.Logger, name string, round func(context.Context) error) error {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if err := round(ctx); err != nil && ctx.Err() == nil {
			logger.Warn(name+" round", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}
