package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

const root = "../.."

func loadProject(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root), cli.WithName("checkout"), cli.WithEnv(nil), cli.WithDiscardEnvFile)
	require.NoError(t, err)
	p, err := opts.LoadProject(context.Background())
	require.NoError(t, err)
	return p
}

func env(s types.ServiceConfig) map[string]string {
	m := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			m[k] = *v
		}
	}
	return m
}

const (
	databaseURL = "postgres://postgres@postgres:5432/checkout?sslmode=disable"
	amqpURL     = "amqp://guest:guest@rabbitmq:5672/"
)

func TestComposeMatchesTheContract(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	require.ElementsMatch(t,
		[]string{"postgres", "redis", "rabbitmq", "stripe-emulator", "mailpit", "api", "dispatcher", "worker"},
		p.ServiceNames())

	tests := []struct {
		service   string
		ports     []uint32
		command   []string
		env       map[string]string
		dependsOn map[string]string // service -> condition
		readyURL  string            // what the healthcheck probes, "" for images' own probes
	}{
		{service: "postgres", ports: []uint32{5432}},
		{service: "redis", ports: []uint32{6379}},
		{service: "rabbitmq", ports: []uint32{5672, 15672}},
		{service: "mailpit", ports: []uint32{1025, 8025}},
		{
			service: "stripe-emulator", ports: []uint32{12111}, command: []string{"stripe-emulator"},
			env: map[string]string{"STRIPE_EMULATOR_ADDR": ":12111",
				"STRIPE_EMULATOR_WEBHOOK_URL": "http://api:8080/v1/webhooks/stripe", "STRIPE_WEBHOOK_SECRET": "whsec_test_checkout"},
			readyURL: "http://127.0.0.1:12111/healthz",
		},
		{
			service: "api", ports: []uint32{8080}, command: []string{"api"},
			env: map[string]string{
				"HTTP_ADDR": ":8080", "DATABASE_URL": databaseURL, "REDIS_URL": "redis://redis:6379/0",
				"REDIS_KEY_PREFIX": "checkout:", "STRIPE_API_BASE": "http://stripe-emulator:12111",
				"STRIPE_SECRET_KEY": "sk_test_123", "IDEMPOTENCY_TTL": "24h", "IDEMPOTENCY_LEASE": "30s",
				"DEDUP_FAILURE_MODE": "closed", "CHECKOUT_API_KEYS": "acme:sk_test_acme,globex:sk_test_globex",
				"STRIPE_WEBHOOK_SECRET": "whsec_test_checkout", "LOG_LEVEL": "info",
			},
			dependsOn: map[string]string{"postgres": "service_healthy", "redis": "service_healthy", "stripe-emulator": "service_healthy"},
			readyURL:  "http://127.0.0.1:8080/readyz",
		},
		{
			service: "dispatcher", ports: []uint32{9091}, command: []string{"dispatcher"},
			env:       map[string]string{"DATABASE_URL": databaseURL, "AMQP_URL": amqpURL, "METRICS_ADDR": ":9091", "LOG_LEVEL": "info"},
			dependsOn: map[string]string{"postgres": "service_healthy", "rabbitmq": "service_healthy", "api": "service_healthy"},
			readyURL:  "http://127.0.0.1:9091/readyz",
		},
		{
			service: "worker", ports: []uint32{9092}, command: []string{"worker"},
			env: map[string]string{
				"DATABASE_URL": databaseURL, "AMQP_URL": amqpURL, "SMTP_ADDR": "mailpit:1025",
				"SMTP_FROM": "orders@checkout.local", "METRICS_ADDR": ":9092", "LOG_LEVEL": "info",
				"STRIPE_API_BASE": "http://stripe-emulator:12111", "STRIPE_SECRET_KEY": "sk_test_123",
				"IDEMPOTENCY_TTL": "24h", "IDEMPOTENCY_LEASE": "30s",
			},
			dependsOn: map[string]string{"postgres": "service_healthy", "rabbitmq": "service_healthy", "mailpit": "service_healthy",
				"stripe-emulator": "service_healthy", "api": "service_healthy"},
			readyURL: "http://127.0.0.1:9092/readyz",
		},
	}
	for _, tt := range tests {
		t.Run(tt.service, func(t *testing.T) {
			s, err := p.GetService(tt.service)
			require.NoError(t, err)

			var targets []uint32
			for _, port := range s.Ports {
				targets = append(targets, port.Target)
				require.Equal(t, port.Target, mustAtoi(t, port.Published), "published as itself")
			}
			require.ElementsMatch(t, tt.ports, targets)

			require.NotNil(t, s.HealthCheck, "healthcheck")
			require.False(t, s.HealthCheck.Disable)
			require.NotEmpty(t, s.HealthCheck.Test)
			if tt.readyURL != "" {
				require.Equal(t, "CMD", s.HealthCheck.Test[0])
				require.Equal(t, tt.readyURL, s.HealthCheck.Test[len(s.HealthCheck.Test)-1])
			}

			if tt.command != nil {
				require.Equal(t, tt.command, []string(s.Command))
				require.NotNil(t, s.Build, "built from this repository")
				require.Equal(t, "all", s.Build.Target)
			}
			if tt.env != nil {
				require.Equal(t, tt.env, env(s))
			}
			deps := map[string]string{}
			for name, d := range s.DependsOn {
				deps[name] = d.Condition
			}
			if tt.dependsOn == nil {
				tt.dependsOn = map[string]string{}
			}
			require.Equal(t, tt.dependsOn, deps)
		})
	}
}

func TestDockerfileBuildsEveryBinary(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	df := string(b)
	require.Contains(t, df, "go build -trimpath -ldflags=\"-s -w\" -o /out/ ./cmd/...")
	require.Contains(t, df, "AS all")
	require.Contains(t, df, "AS single")

	// Every command the compose file runs is a binary ./cmd/... builds.
	p := loadProject(t)
	for _, s := range p.Services {
		if len(s.Command) == 0 {
			continue
		}
		info, err := os.Stat(filepath.Join(root, "cmd", s.Command[0], "main.go"))
		require.NoError(t, err, "service %s runs %s", s.Name, s.Command[0])
		require.False(t, info.IsDir())
	}
}

func mustAtoi(t *testing.T, s string) uint32 {
	t.Helper()
	var n uint32
	for _, c := range strings.TrimSpace(s) {
		require.True(t, c >= '0' && c <= '9', "port %q", s)
		n = n*10 + uint32(c-'0')
	}
	return n
}
