// Package migrations embeds the goose SQL migrations of the checkout schema.
package migrations

import "embed"

// FS holds the numbered goose migrations (*.sql), applied in order by
// postgres.Migrate.
//
//go:embed *.sql
var FS embed.FS
