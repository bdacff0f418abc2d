package postgres_test

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/migrations"
)

// landed are the migrations of every release, each under the version it
// shipped with. goose records applied migrations by version alone, so a
// migration renumbered, or a new one given a version that shipped, is
// skipped on every database that ran the old one: the schema is then
// half-migrated (a later migration fails on a table that was never
// made). Append new migrations here; never change a line.
var landed = []string{
	"00001_schema.sql",
	"00002_payment_saga.sql",
	"00003_stock_buckets_no_notify.sql",
	"00004_refunds_and_event_order.sql",
	"00005_outbox_next_seq_plpgsql.sql",
	"00006_reserve_one_releases_skipped_locks.sql",
	"00007_orphan_sweep_index.sql",
	"00008_order_return_url.sql",
	"00009_refund_requires_attention.sql",
	"00010_notification_retry_window.sql",
	"00011_notification_refund_amount.sql",
	"00012_notification_order_amount.sql",
	"00013_batch_guard.sql",
	"00014_inbox_parked_max.sql",
	"00015_outbox_traceparent.sql",
	"00016_notification_traceparent.sql",
	"00017_dead_letters.sql",
	"00018_key_retention_from_finish.sql",
	"00019_stray_refund_index.sql",
	"00020_refunds_in_doubt_over_total.sql",
	"00021_dead_letter_event_order.sql",
	"00022_parked_traceparent.sql",
}

// TestMigrationsKeepTheirVersions: every migration that shipped is still
// there under its version, and the ones after it come after it.
func TestMigrationsKeepTheirVersions(t *testing.T) {
	files, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), len(landed))
	require.Equal(t, landed, files[:len(landed)], "a migration that shipped was renumbered or renamed")
}
