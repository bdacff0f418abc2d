package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

const root = "../.."

// loadProject parses docker-compose.yml as `docker compose` would, with only
// the given variables set (KEY=value): nil gives every default.
func loadProject(t *testing.T, vars ...string) *types.Project {
	t.Helper()
	return loadProjectFile(t, filepath.Join(root, "docker-compose.yml"), vars...)
}

// loadProjectFile is loadProject for the compose file at file, in its folder.
func loadProjectFile(t *testing.T, file string, vars ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{file},
		cli.WithWorkingDirectory(filepath.Dir(file)), cli.WithEnv(vars), cli.WithDiscardEnvFile)
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

// infrastructure are the services a developer's machine may run too.
var infrastructure = []string{"postgres", "redis", "rabbitmq"}

// otlpEndpoint is where compose's processes send their traces: Jaeger's
// OTLP/HTTP receiver (issue 38).
const otlpEndpoint = "http://jaeger:4318"

func TestComposeMatchesTheContract(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	require.ElementsMatch(t,
		[]string{"postgres", "redis", "rabbitmq", "stripe-emulator", "mailpit", "migrate", "api", "dispatcher", "worker", "storefront",
			"jaeger", "prometheus", "grafana"},
		p.ServiceNames())

	tests := []struct {
		service   string
		ports     []uint32 // the stack's own ports, published on the host as themselves
		command   []string
		env       map[string]string
		dependsOn map[string]string // service -> condition
		readyURL  string            // what the healthcheck probes, "" for images' own probes
		oneShot   bool              // runs to completion: no healthcheck, never restarted
		target    string            // the Dockerfile's stage, for the services built here
	}{
		{service: "postgres"},
		{service: "redis"},
		{service: "rabbitmq"},
		{service: "mailpit", ports: []uint32{8025}},
		{
			service: "stripe-emulator", ports: []uint32{12111}, command: []string{"stripe-emulator"}, target: "emulator",
			env: map[string]string{
				"STRIPE_EMULATOR_ADDR": ":12111", "STRIPE_WEBHOOK_SECRET": "whsec_test_checkout",
				"STRIPE_EMULATOR_WEBHOOK_URL": "http://api:8080/v1/webhooks/stripe",
				"STRIPE_EMULATOR_PUBLIC_URL":  "http://localhost:12111",
			},
			readyURL: "http://127.0.0.1:12111/healthz",
		},
		{
			service: "migrate", command: []string{"migrate"}, target: "all", oneShot: true,
			env:       map[string]string{"DATABASE_URL": databaseURL, "MIGRATE_TIMEOUT": "5m", "LOG_LEVEL": "info"},
			dependsOn: map[string]string{"postgres": "service_healthy"},
		},
		{
			service: "api", ports: []uint32{8080}, command: []string{"api"}, target: "all",
			env: map[string]string{
				"HTTP_ADDR": ":8080", "MIGRATE_ON_START": "false", "DATABASE_URL": databaseURL, "REDIS_URL": "redis://redis:6379/0",
				"REDIS_KEY_PREFIX": "checkout:", "STRIPE_API_BASE": "http://stripe-emulator:12111",
				"STRIPE_SECRET_KEY": "sk_test_123", "STRIPE_WEBHOOK_SECRET": "whsec_test_checkout",
				"IDEMPOTENCY_TTL": "24h", "IDEMPOTENCY_LEASE": "30s",
				"DEDUP_FAILURE_MODE": "closed", "CHECKOUT_API_KEYS": "acme:sk_test_acme,globex:sk_test_globex",
				"LOG_LEVEL": "info", "OTEL_EXPORTER_OTLP_ENDPOINT": otlpEndpoint,
			},
			dependsOn: map[string]string{"postgres": "service_healthy", "redis": "service_healthy", "stripe-emulator": "service_healthy",
				"migrate": "service_completed_successfully"},
			readyURL: "http://127.0.0.1:8080/readyz",
		},
		{
			// CONTRACT.md (v3) Clients: the shop of one tenant, by the api's service name.
			service: "storefront", ports: []uint32{8081}, command: []string{"storefront"}, target: "dev",
			env: map[string]string{"STOREFRONT_ADDR": ":8081", "STOREFRONT_TENANT_KEY": "sk_test_acme", "API_URL": "http://api:8080",
				"TRACE_UI_URL": "http://localhost:16686", "OTEL_EXPORTER_OTLP_ENDPOINT": otlpEndpoint},
			dependsOn: map[string]string{"api": "service_healthy"},
			readyURL:  "http://127.0.0.1:8081/healthz",
		},
		{
			service: "dispatcher", ports: []uint32{9091}, command: []string{"dispatcher"}, target: "all",
			env: map[string]string{"DATABASE_URL": databaseURL, "AMQP_URL": amqpURL, "METRICS_ADDR": ":9091", "LOG_LEVEL": "info",
				"OTEL_EXPORTER_OTLP_ENDPOINT": otlpEndpoint},
			dependsOn: map[string]string{"postgres": "service_healthy", "rabbitmq": "service_healthy", "api": "service_healthy"},
			readyURL:  "http://127.0.0.1:9091/readyz",
		},
		{
			service: "worker", ports: []uint32{9092}, command: []string{"worker"}, target: "all",
			env: map[string]string{
				"DATABASE_URL": databaseURL, "AMQP_URL": amqpURL, "SMTP_ADDR": "mailpit:1025",
				"SMTP_FROM": "orders@checkout.local", "METRICS_ADDR": ":9092", "LOG_LEVEL": "info", "OTEL_EXPORTER_OTLP_ENDPOINT": otlpEndpoint,
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

			if tt.ports != nil {
				var targets []uint32
				for _, port := range s.Ports {
					targets = append(targets, port.Target)
					require.Equal(t, port.Target, mustAtoi(t, port.Published), "published as itself")
				}
				require.ElementsMatch(t, tt.ports, targets)
			}

			if tt.oneShot {
				// restart: unless-stopped (x-app) would run it again and
				// again after it exits 0.
				require.Equal(t, "no", s.Restart, "a one-shot service is not restarted")
				require.Nil(t, s.HealthCheck, "dependents wait for service_completed_successfully")
			} else {
				require.NotNil(t, s.HealthCheck, "healthcheck")
				require.False(t, s.HealthCheck.Disable)
				require.NotEmpty(t, s.HealthCheck.Test)
			}
			if tt.readyURL != "" {
				require.Equal(t, "CMD", s.HealthCheck.Test[0])
				require.Equal(t, tt.readyURL, s.HealthCheck.Test[len(s.HealthCheck.Test)-1])
			}

			if tt.command != nil {
				require.Equal(t, tt.command, []string(s.Command))
				require.NotNil(t, s.Build, "built from this repository")
				require.Equal(t, tt.target, s.Build.Target)
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

// localPorts are the ports a developer's own PostgreSQL, Redis, RabbitMQ (AMQP,
// AMQPS, management UI, inter-node, epmd) or mail catcher holds: the README's
// non-Docker path asks for those, so `docker compose up` must not bind them.
var localPorts = map[uint32]string{
	5432: "PostgreSQL", 6379: "Redis", 5672: "RabbitMQ AMQP", 5671: "RabbitMQ AMQPS",
	15672: "RabbitMQ management", 15671: "RabbitMQ management TLS", 25672: "RabbitMQ inter-node",
	4369: "epmd", 1025: "a local SMTP catcher",
}

func TestNoHostPortThatALocalServiceHolds(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	require.NoError(t, hostPortClashes(p))

	// The opt-in variables move the ports; the defaults are what README says.
	moved := loadProject(t, "CHECKOUT_POSTGRES_PORT=25433", "CHECKOUT_RABBITMQ_UI_PORT=25674")
	require.Equal(t, []string{"25433"}, published(t, moved, "postgres"))
	require.Equal(t, []string{"25674"}, published(t, moved, "rabbitmq"))
	require.Equal(t, []string{"15432"}, published(t, p, "postgres"))
	require.Equal(t, []string{"15673"}, published(t, p, "rabbitmq"))
	require.Empty(t, published(t, p, "redis"))

	// The check itself: the compose file of issue 8 fails it.
	bad := loadProject(t, "CHECKOUT_POSTGRES_PORT=5432")
	require.ErrorContains(t, hostPortClashes(bad), "5432")
}

// hostPortClashes reports a published host port that a local service would
// hold, an infrastructure port published beyond loopback (trust auth, guest
// account) or on a random port, and a host port published twice.
func hostPortClashes(p *types.Project) error {
	var errs []string
	seen := map[string]string{}
	for _, s := range p.Services {
		infra := slices.Contains(infrastructure, s.Name)
		for _, port := range s.Ports {
			if port.Published == "" {
				if infra {
					errs = append(errs, fmt.Sprintf("%s: %d published on a random host port", s.Name, port.Target))
				}
				continue
			}
			lo, hi, err := portRange(port.Published)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", s.Name, err))
				continue
			}
			for n := lo; n <= hi; n++ {
				if what, ok := localPorts[n]; ok {
					errs = append(errs, fmt.Sprintf("%s: host port %d is %s's on a developer's machine", s.Name, n, what))
				}
				key := port.HostIP + ":" + strconv.Itoa(int(n))
				if other, ok := seen[key]; ok {
					errs = append(errs, fmt.Sprintf("%s and %s both publish %s", other, s.Name, key))
				}
				seen[key] = s.Name
			}
			if infra && port.HostIP != "127.0.0.1" {
				errs = append(errs, fmt.Sprintf("%s: %d published on %q, not on loopback only", s.Name, port.Target, port.HostIP))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func portRange(s string) (lo, hi uint32, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	x, err1 := strconv.ParseUint(a, 10, 16)
	y, err2 := strconv.ParseUint(b, 10, 16)
	if err1 != nil || err2 != nil || y < x {
		return 0, 0, fmt.Errorf("published port %q", s)
	}
	return uint32(x), uint32(y), nil
}

func published(t *testing.T, p *types.Project, service string) []string {
	t.Helper()
	s, err := p.GetService(service)
	require.NoError(t, err)
	var out []string
	for _, port := range s.Ports {
		out = append(out, port.Published)
	}
	return out
}

// TestComposeVariablesAreDocumented: every ${VAR:-default} of the compose file
// is in README with its default, so a user knows the port to reach.
func TestComposeVariablesAreDocumented(t *testing.T) {
	t.Parallel()
	compose, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	vars := regexp.MustCompile(`\$\{([A-Z0-9_]+):-([^}]*)\}`).FindAllStringSubmatch(string(compose), -1)
	require.NotEmpty(t, vars)
	for _, v := range vars {
		require.True(t, strings.Contains(string(readme), v[1]), "README names %s", v[1])
		require.True(t, strings.Contains(string(readme), v[1]+"` (default `"+v[2]+"`"),
			"README gives %s's default as \"`%s` (default `%s`\"", v[1], v[1], v[2])
	}
}

// dataDir is where each stateful image keeps its data.
func dataDir(t *testing.T, s types.ServiceConfig) string {
	t.Helper()
	switch s.Name {
	case "postgres":
		// The official image moved PGDATA's volume with 18: a volume on the
		// old path would leave the data in an anonymous volume.
		if major(t, s.Image) >= 18 {
			return "/var/lib/postgresql"
		}
		return "/var/lib/postgresql/data"
	case "rabbitmq":
		return "/var/lib/rabbitmq"
	case "redis":
		return "/data"
	}
	t.Fatalf("no data directory known for %s", s.Name)
	return ""
}

func TestStatefulServicesKeepTheirDataAcrossARecreate(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	require.NoError(t, statefulDefects(t, p))
}

// statefulDefects reports a stateful service without a fixed hostname
// (RabbitMQ names its node, and so its data directory, after it: a new
// container would start an empty node) or without a named volume on its data
// directory (an anonymous one is left behind by `down` and not found by the
// next `up`).
func statefulDefects(t *testing.T, p *types.Project) error {
	var errs []string
	for _, name := range infrastructure {
		s, err := p.GetService(name)
		require.NoError(t, err)
		if s.Hostname == "" {
			errs = append(errs, name+": no fixed hostname")
		}
		dir := dataDir(t, s)
		found := false
		for _, v := range s.Volumes {
			if v.Target != dir {
				continue
			}
			found = true
			if v.Type != types.VolumeTypeVolume || v.Source == "" {
				errs = append(errs, fmt.Sprintf("%s: %s is a %s volume %q, not a named volume", name, dir, v.Type, v.Source))
				continue
			}
			decl, ok := p.Volumes[v.Source]
			if !ok {
				errs = append(errs, fmt.Sprintf("%s: volume %q is not declared under volumes:", name, v.Source))
			} else if bool(decl.External) {
				errs = append(errs, fmt.Sprintf("%s: volume %q is external: `down -v` would not remove it", name, v.Source))
			}
		}
		if !found {
			errs = append(errs, fmt.Sprintf("%s: no named volume on %s", name, dir))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func TestStatefulDefectsAreCaught(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	rabbit := p.Services["rabbitmq"]
	rabbit.Hostname = ""
	p.Services["rabbitmq"] = rabbit
	pg := p.Services["postgres"]
	pg.Volumes = []types.ServiceVolumeConfig{{Type: types.VolumeTypeVolume, Target: dataDir(t, pg)}} // anonymous
	p.Services["postgres"] = pg
	err := statefulDefects(t, p)
	require.ErrorContains(t, err, "rabbitmq: no fixed hostname")
	require.ErrorContains(t, err, "postgres: "+dataDir(t, pg)+" is a volume volume \"\", not a named volume")
}

func TestHealthchecksMeanReadyAndStayQuiet(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	pg, err := p.GetService("postgres")
	require.NoError(t, err)
	require.NoError(t, postgresProbeUsesTCP(pg.HealthCheck.Test))

	// The issue's probe: the socket answers while the entrypoint's
	// temporary init server, which takes no TCP, still runs.
	require.Error(t, postgresProbeUsesTCP(types.HealthCheckTest{"CMD-SHELL", "pg_isready -U postgres -d checkout"}))
	require.Error(t, postgresProbeUsesTCP(types.HealthCheckTest{"CMD", "pg_isready", "-h", "/var/run/postgresql"}))
	require.NoError(t, postgresProbeUsesTCP(types.HealthCheckTest{"CMD-SHELL", "psql -h 127.0.0.1 -U postgres -d checkout -c 'select 1'"}))
	require.NoError(t, postgresProbeUsesTCP(types.HealthCheckTest{"CMD", "pg_isready", "--host=localhost"}))

	rabbit, err := p.GetService("rabbitmq")
	require.NoError(t, err)
	require.NoError(t, rabbitProbeDefects(t, rabbit.HealthCheck.Test))

	for _, s := range p.Services {
		if s.Restart == "no" {
			continue // one-shot (migrate): checked in TestComposeMatchesTheContract
		}
		h := s.HealthCheck
		require.NotNil(t, h, s.Name)
		require.NoError(t, probeCadence(h), s.Name)
	}
	require.Error(t, probeCadence(&types.HealthCheckConfig{Interval: dur(2 * time.Second)}), "the issue's 2s probe")
}

// postgresProbeUsesTCP fails a pg_isready or psql probe without a TCP host:
// without -h it goes through the Unix socket.
func postgresProbeUsesTCP(test types.HealthCheckTest) error {
	var args []string
	switch {
	case len(test) == 2 && test[0] == "CMD-SHELL":
		args = strings.Fields(test[1])
	case len(test) > 1 && test[0] == "CMD":
		args = test[1:]
	default:
		return fmt.Errorf("healthcheck %q: neither CMD nor CMD-SHELL", test)
	}
	if len(args) == 0 || (args[0] != "pg_isready" && args[0] != "psql") {
		return fmt.Errorf("healthcheck %q: not pg_isready or psql", test)
	}
	host := ""
	for i, a := range args {
		switch {
		case (a == "-h" || a == "--host") && i+1 < len(args):
			host = args[i+1]
		case strings.HasPrefix(a, "--host="):
			host = strings.TrimPrefix(a, "--host=")
		case strings.HasPrefix(a, "-h") && len(a) > 2:
			host = a[2:]
		}
	}
	if host == "" || strings.HasPrefix(host, "/") {
		return fmt.Errorf("healthcheck %q probes the Unix socket, not TCP", test)
	}
	return nil
}

// probeCadence fails a probe that runs more often than every 5s once the
// service is up (every probe of the api is a log line) or one that slows
// startup: a service starting probes at least every 2s, within a start period.
func probeCadence(h *types.HealthCheckConfig) error {
	if h.Interval == nil || time.Duration(*h.Interval) < 5*time.Second {
		return fmt.Errorf("interval %v: under 5s", h.Interval)
	}
	if h.StartPeriod == nil || time.Duration(*h.StartPeriod) < 10*time.Second {
		return fmt.Errorf("start_period %v: under 10s", h.StartPeriod)
	}
	if h.StartInterval == nil || time.Duration(*h.StartInterval) > 2*time.Second {
		return fmt.Errorf("start_interval %v: unset or over 2s, a slow first start", h.StartInterval)
	}
	return nil
}

func dur(d time.Duration) *types.Duration {
	x := types.Duration(d)
	return &x
}

// minimum is the oldest supported line of each image (their makers' support
// windows): RabbitMQ's community support covers only the latest minor, 4.3
// (whose delivery limit counts a basic.reject and not a basic.nack: the
// consumer rejects a failed message, internal/rabbitmq).
var minimum = map[string][2]int{
	"postgres": {16, 0},
	"redis":    {7, 4},
	"rabbitmq": {4, 3},
}

func TestImagesAreOnSupportedLines(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	for _, s := range p.Services {
		if s.Build != nil {
			continue
		}
		repo, tag, ok := strings.Cut(s.Image, ":")
		require.True(t, ok && tag != "" && tag != "latest", "%s: image %q is pinned to a line", s.Name, s.Image)
		floor, known := minimum[repo]
		if !known {
			continue
		}
		require.NoError(t, supported(s.Image, floor), s.Name)
	}
	require.Error(t, supported("rabbitmq:3.13-management-alpine", minimum["rabbitmq"]), "the issue's image")
	rabbit, err := p.GetService("rabbitmq")
	require.NoError(t, err)
	require.Contains(t, rabbit.Image, "management", "README points at the management UI")
}

func supported(image string, floor [2]int) error {
	_, tag, _ := strings.Cut(image, ":")
	m := regexp.MustCompile(`^(\d+)(?:\.(\d+))?`).FindStringSubmatch(tag)
	if m == nil {
		return fmt.Errorf("%s: no version in the tag", image)
	}
	maj, _ := strconv.Atoi(m[1])
	minor := 0
	if m[2] != "" {
		minor, _ = strconv.Atoi(m[2])
	}
	if maj < floor[0] || (maj == floor[0] && minor < floor[1]) {
		return fmt.Errorf("%s: older than %d.%d, out of support", image, floor[0], floor[1])
	}
	return nil
}

func major(t *testing.T, image string) int {
	t.Helper()
	_, tag, _ := strings.Cut(image, ":")
	m := regexp.MustCompile(`^(\d+)`).FindString(tag)
	require.NotEmpty(t, m, "image %q has a version tag", image)
	n, err := strconv.Atoi(m)
	require.NoError(t, err)
	return n
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

// TestProjectNameIsFixed (issue 34): the compose file names its project, so
// the volumes are checkout_postgres-data and so on, as README says, in a
// clone whatever its folder is called.
func TestProjectNameIsFixed(t *testing.T) {
	t.Parallel()
	require.NoError(t, projectNameDefects(loadProject(t)))

	// The check itself: the compose file of issue 34, without a name, in a
	// clone named my-clone.
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	require.NoError(t, err)
	unnamed := regexp.MustCompile(`(?m)^name: .*$`).ReplaceAll(b, nil)
	require.NotEqual(t, b, unnamed)
	file := filepath.Join(t.TempDir(), "my-clone", "docker-compose.yml")
	require.NoError(t, os.MkdirAll(filepath.Dir(file), 0o755))
	require.NoError(t, os.WriteFile(file, unnamed, 0o644))
	require.ErrorContains(t, projectNameDefects(loadProjectFile(t, file)), "my-clone_postgres-data")
}

// projectNameDefects reports a project not named checkout, and a volume not
// named after it.
func projectNameDefects(p *types.Project) error {
	var errs []string
	if p.Name != "checkout" {
		errs = append(errs, fmt.Sprintf("project %q, not checkout", p.Name))
	}
	for key, v := range p.Volumes {
		if want := "checkout_" + key; v.Name != want {
			errs = append(errs, fmt.Sprintf("volume %s is %s, not %s", key, v.Name, want))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// TestPortsOnLoopbackByDefault (issue 34): every port the stack publishes is
// on 127.0.0.1 unless CHECKOUT_HOST_IP says otherwise: nothing in it asks for
// a password (the api's development keys, the emulator's fault endpoint).
// CHECKOUT_HOST_IP moves the stack's own ports and never Postgres' or
// RabbitMQ's (trust auth, the guest account; TestNoHostPortThatALocalServiceHolds).
func TestPortsOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	require.NoError(t, portsBoundTo(loadProject(t), "127.0.0.1", "127.0.0.1"))
	wide := loadProject(t, "CHECKOUT_HOST_IP=0.0.0.0")
	require.NoError(t, portsBoundTo(wide, "0.0.0.0", "127.0.0.1"))
	require.NoError(t, hostPortClashes(wide))

	// The check itself: the api's port of issue 34, on every interface.
	p := loadProject(t)
	api := p.Services["api"]
	api.Ports = []types.ServicePortConfig{{Target: 8080, Published: "8080", Protocol: "tcp"}}
	p.Services["api"] = api
	require.ErrorContains(t, portsBoundTo(p, "127.0.0.1", "127.0.0.1"), `api: 8080 published on "", not on 127.0.0.1`)
}

// portsBoundTo reports a port of the stack's own published on another address
// than own, and one of the infrastructure's on another than infra.
func portsBoundTo(p *types.Project, own, infra string) error {
	var errs []string
	n := 0
	for _, s := range p.Services {
		want := own
		if slices.Contains(infrastructure, s.Name) {
			want = infra
		}
		for _, port := range s.Ports {
			n++
			if port.HostIP != want {
				errs = append(errs, fmt.Sprintf("%s: %d published on %q, not on %s", s.Name, port.Target, port.HostIP, want))
			}
		}
	}
	if n == 0 {
		errs = append(errs, "no published port")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// rabbitProbeDefects runs the RabbitMQ healthcheck's command, as compose
// gives it to the container's shell, with rabbitmq-diagnostics and
// rabbitmqctl stubbed to answer as RabbitMQ does in each case below (the
// format is that of `rabbitmqctl -q list_queues --no-table-headers type state
// leader`: tab-separated, an empty leader for a queue whose leader is not
// alive, as rabbit_quorum_queue's info reports it), and reports each case
// where the probe does not say what the case is.
func rabbitProbeDefects(t *testing.T, test types.HealthCheckTest) error {
	t.Helper()
	bin := t.TempDir()
	for name, script := range map[string]string{
		"rabbitmq-diagnostics": "#!/bin/sh\nexit \"${STUB_DIAGNOSTICS_EXIT:-0}\"\n",
		"rabbitmqctl":          "#!/bin/sh\nprintf '%b' \"$STUB_QUEUES\"\nexit \"${STUB_CTL_EXIT:-0}\"\n",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755))
	}
	var argv []string
	switch {
	case len(test) == 2 && test[0] == "CMD-SHELL":
		argv = []string{"/bin/sh", "-c", test[1]}
	case len(test) > 1 && test[0] == "CMD":
		argv = slices.Clone(test[1:])
		// exec.Command looks the program up in this process's PATH.
		if stub := filepath.Join(bin, argv[0]); !strings.Contains(argv[0], "/") && fileExists(stub) {
			argv[0] = stub
		}
	default:
		return fmt.Errorf("healthcheck %q: neither CMD nor CMD-SHELL", test)
	}
	var errs []string
	for _, c := range []struct {
		name    string
		env     []string
		healthy bool
	}{
		{"the first start: no queue yet, the app declares them", nil, true},
		{"a restart, the queues recovered with their leader", []string{"STUB_QUEUES=quorum\trunning\trabbit@rabbitmq\nquorum\trunning\trabbit@rabbitmq\n"}, true},
		{"a classic queue of someone else's", []string{"STUB_QUEUES=classic\trunning\trabbit@rabbitmq\n"}, true},
		{"a restart, a quorum queue still recovering", []string{"STUB_QUEUES=quorum\trunning\trabbit@rabbitmq\nquorum\trecovering\t\n"}, false},
		{"a restart, a quorum queue running without a leader yet", []string{"STUB_QUEUES=quorum\trunning\t\n"}, false},
		{"a quorum queue down", []string{"STUB_QUEUES=quorum\tdown\t\n"}, false},
		{"the listeners closed", []string{"STUB_DIAGNOSTICS_EXIT=69"}, false},
		{"the queues not listed", []string{"STUB_CTL_EXIT=75"}, false},
	} {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append([]string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")}, c.env...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			return fmt.Errorf("run %q: %w", argv, err)
		}
		if healthy := err == nil; healthy != c.healthy {
			errs = append(errs, fmt.Sprintf("%s: healthy %v, want %v (%s)", c.name, healthy, c.healthy, out))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// TestRabbitProbeOfIssue34IsCaught: the probe of issue 34 reported healthy
// before its quorum queue had a leader.
func TestRabbitProbeOfIssue34IsCaught(t *testing.T) {
	t.Parallel()
	err := rabbitProbeDefects(t, types.HealthCheckTest{"CMD", "rabbitmq-diagnostics", "-q", "check_port_connectivity"})
	require.ErrorContains(t, err, "a quorum queue running without a leader yet: healthy true, want false")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
