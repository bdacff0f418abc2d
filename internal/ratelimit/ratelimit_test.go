package ratelimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Limit
		err  string
	}{
		{"0", Limit{}, ""},
		{"200/s", Limit{Rate: 200, Period: time.Second, Burst: 400}, ""},
		{" 10/m ", Limit{Rate: 10, Period: time.Minute, Burst: 20}, ""},
		{"1/h", Limit{Rate: 1, Period: time.Hour, Burst: 2}, ""},
		{"", Limit{}, "want 0 or N/s"},
		{"200", Limit{}, "want 0 or N/s"},
		{"0/s", Limit{}, "want 0 or N/s"},
		{"-1/s", Limit{}, "want 0 or N/s"},
		{"1.5/s", Limit{}, "want 0 or N/s"},
		{"10/d", Limit{}, "the unit must be s, m or h"},
		{"10/second", Limit{}, "the unit must be s, m or h"},
		{"99999999999/s", Limit{}, "want 0 or N/s"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseLimit(tc.in)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestParseTenantLimits(t *testing.T) {
	t.Parallel()
	got, err := ParseTenantLimits("acme:50/s, globex:0,")
	require.NoError(t, err)
	require.Equal(t, map[string]Limit{"acme": {Rate: 50, Period: time.Second, Burst: 100}, "globex": {}}, got)

	got, err = ParseTenantLimits("")
	require.NoError(t, err)
	require.Empty(t, got)

	for in, want := range map[string]string{
		"acme":                  "entry 1: want tenant:limit",
		":5/s":                  "entry 1: want tenant:limit",
		"acme:5/s,acme:6/s":     "entry 2: tenant acme listed twice",
		"acme:5/s,globex:lots":  "entry 2 (tenant globex)",
		"acme:5/s,globex:5/day": "the unit must be s, m or h",
	} {
		_, err := ParseTenantLimits(in)
		require.ErrorContains(t, err, want, in)
	}
}

func TestConfigLimitFor(t *testing.T) {
	t.Parallel()
	def, _ := ParseLimit("200/s")
	replay, _ := ParseLimit("1000/s")
	acme, _ := ParseLimit("5/s")
	c := Config{Default: def, Replay: replay, Tenants: map[string]Limit{"acme": acme, "globex": {}}}
	require.Equal(t, acme, c.limitFor("acme", false), "a tenant's override")
	require.Equal(t, Limit{}, c.limitFor("globex", false), "an override of 0 turns the limit off for that tenant")
	require.Equal(t, def, c.limitFor("initech", false), "the default")
	require.Equal(t, replay, c.limitFor("acme", true), "replays have their own bucket, whatever the tenant")
	require.True(t, c.Enabled())
	require.False(t, Config{}.Enabled())
	require.False(t, Config{Tenants: map[string]Limit{"acme": {}}}.Enabled())
	require.True(t, Config{Tenants: map[string]Limit{"acme": acme}}.Enabled())
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int{
		-1:                     1,
		0:                      1,
		time.Millisecond:       1,
		time.Second:            1,
		time.Second + 1:        2,
		59*time.Second + 999e6: 60,
		60 * time.Second:       60,
	} {
		require.Equal(t, want, retryAfterSeconds(d), "%s", d)
	}
}

func TestKeyUnderPrefix(t *testing.T) {
	t.Parallel()
	l := &Limiter{prefix: "checkout:"}
	require.Equal(t, "checkout:ratelimit:{acme}:request", l.key("acme", "request"))
	require.Equal(t, []string{"checkout:ratelimit:{acme}:replay", "other"}, strip([]string{"rate:checkout:ratelimit:{acme}:replay", "other"}))
}
