package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/internal/config"
)

// Shared is exported, as an embedded struct must be for its fields to be set.
type Shared struct {
	URL string `env:"SOME_URL" envDefault:"amqp://guest:guest@host:5672/"`
}

type settings struct {
	Shared
	TTL    time.Duration `env:"SOME_TTL" envDefault:"24h"`
	Secret string        `env:"SOME_SECRET" envDefault:"sk_test_x" secret:"true"`
}

func TestLoad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		wantTTL time.Duration
		wantErr string
	}{
		{"defaults", nil, 24 * time.Hour, ""},
		{"a value", map[string]string{"SOME_TTL": "1h"}, time.Hour, ""},
		{"an empty value is unset", map[string]string{"SOME_TTL": ""}, 24 * time.Hour, ""},
		{"a bad value names the variable", map[string]string{"SOME_TTL": "soon"}, 0, `SOME_TTL="soon"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s settings
			err := config.Load(func(k string) string { return tc.env[k] }, &s)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantTTL, s.TTL)
			require.Equal(t, "amqp://guest:guest@host:5672/", s.URL, "embedded structs are loaded")
		})
	}
}

func TestMasked(t *testing.T) {
	t.Parallel()
	var s settings
	require.NoError(t, config.Load(func(string) string { return "" }, &s))
	got := config.Masked(&s)
	require.Equal(t, []any{
		"SOME_URL", "amqp://guest:***@host:5672/",
		"SOME_TTL", "24h0m0s",
		"SOME_SECRET", "***",
	}, got)
}

// TestMaskedDatabaseURLs: a password is masked in every form DATABASE_URL
// takes: in the userinfo of a URL naming several hosts (libpq multi-host),
// as a query parameter, and in a keyword/value string, quoted or not.
func TestMaskedDatabaseURLs(t *testing.T) {
	t.Parallel()
	type db struct {
		URL string `env:"DATABASE_URL"`
	}
	for in, want := range map[string]string{
		"postgres://app:s3cret@10.0.0.1:5432,10.0.0.2:5432/checkout?target_session_attrs=read-write": "postgres://app:***@10.0.0.1:5432,10.0.0.2:5432/checkout?target_session_attrs=read-write",
		"postgres://10.0.0.1,10.0.0.2/checkout?user=app&password=s3cret&sslmode=require":             "postgres://10.0.0.1,10.0.0.2/checkout?user=app&password=***&sslmode=require",
		"host=10.0.0.1,10.0.0.2 user=app password=s3cret dbname=checkout":                            "host=10.0.0.1,10.0.0.2 user=app password=*** dbname=checkout",
		"host=10.0.0.1 password = 'it\\'s a secret' dbname=checkout":                                 "host=10.0.0.1 password = *** dbname=checkout",
		"postgres://app@10.0.0.1,10.0.0.2/checkout":                                                  "postgres://app@10.0.0.1,10.0.0.2/checkout",
	} {
		s := db{URL: in}
		got := config.Masked(&s)
		require.Equal(t, []any{"DATABASE_URL", want}, got, in)
		require.NotContains(t, got[1], "s3cret")
		require.NotContains(t, got[1], "secret")
	}
}

// TestMaskedURLList: every URL of a comma-separated list loses its
// password, not only the first (AMQP_URL naming a cluster's nodes); a
// libpq multi-host URL keeps its hosts.
func TestMaskedURLList(t *testing.T) {
	t.Parallel()
	var s settings
	env := map[string]string{"SOME_URL": "amqp://app:s3cret@node1:5672/,amqps://app:s3cret@node2:5671/vh,amqp://node3:5672/"}
	require.NoError(t, config.Load(func(k string) string { return env[k] }, &s))
	got := config.Masked(&s)
	require.Equal(t, "amqp://app:***@node1:5672/,amqps://app:***@node2:5671/vh,amqp://node3:5672/", got[1])
	require.NotContains(t, got[1], "s3cret")

	env = map[string]string{"SOME_URL": "postgres://app:s3cret@db1:5432,db2:5432/checkout?target_session_attrs=read-write"}
	require.NoError(t, config.Load(func(k string) string { return env[k] }, &s))
	require.Equal(t, "postgres://app:***@db1:5432,db2:5432/checkout?target_session_attrs=read-write", config.Masked(&s)[1])
}
