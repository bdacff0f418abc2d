package deploy_test

// What a real deploy of deploy/k8s needs beyond valid objects (issue 37):
// pods the kubelet starts, images that are the overlay's pin, migrations
// before the code that needs them, the data services as their operators
// advise and what a platform review asks for.

import (
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// imageStages maps each image the overlays pin (the name the containers
// use) to the Dockerfile stage it is built from: the default target, and
// the emulator target the Dockerfile's header builds as checkout-emulator.
var imageStages = map[string]func(instructions []string) string{
	"checkout":          lastStage,
	"checkout-emulator": func([]string) string { return "emulator" },
}

// stageUser returns the argument of the last USER instruction in effect for
// stage, as the image's config records it ("" when none is): a stage built
// FROM another stage inherits that stage's USER until it sets its own.
func stageUser(instructions []string, stage string) string {
	parent := map[string]string{} // stage -> the stage it is built FROM
	user := map[string]string{}   // stage -> its own last USER
	current := ""
	for _, ins := range instructions {
		f := strings.Fields(ins)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			current = ""
			if len(f) == 4 && strings.EqualFold(f[2], "AS") {
				current = f[3]
				parent[current] = f[1]
			}
		case "USER":
			if current != "" && len(f) == 2 {
				user[current] = f[1]
			}
		}
	}
	for s, seen := stage, 0; s != "" && seen < len(parent)+1; s, seen = parent[s], seen+1 {
		if u, ok := user[s]; ok {
			return u
		}
	}
	return ""
}

// imageUser splits an image's configured user as the container runtime does
// before the kubelet sees it: the part before ":" is a uid when numeric,
// else a name. Ported from containerd's getUserFromImage
// (internal/cri/server/images/image_status.go), which fills the CRI
// ImageStatus's uid and username that the kubelet's getImageUser reads.
func imageUser(user string) (*int64, string) {
	if user == "" {
		return nil, ""
	}
	user, _, _ = strings.Cut(user, ":")
	uid, err := strconv.ParseInt(user, 10, 64)
	if err != nil {
		return nil, user
	}
	return &uid, ""
}

// effectiveRunAs merges the pod's and the container's security contexts as
// the kubelet does (k8s.io/kubernetes/pkg/securitycontext,
// DetermineEffectiveSecurityContext): the container's field, when set,
// wins.
func effectiveRunAs(pod *corev1.PodSpec, c *corev1.Container) (runAsNonRoot *bool, runAsUser *int64) {
	if sc := pod.SecurityContext; sc != nil {
		runAsNonRoot, runAsUser = sc.RunAsNonRoot, sc.RunAsUser
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsNonRoot != nil {
			runAsNonRoot = sc.RunAsNonRoot
		}
		if sc.RunAsUser != nil {
			runAsUser = sc.RunAsUser
		}
	}
	return runAsNonRoot, runAsUser
}

// verifyRunAsNonRoot is the kubelet's check before it creates a container;
// an error is the pod's CreateContainerConfigError. A faithful port of
// verifyRunAsNonRoot in k8s.io/kubernetes v1.34.4,
// pkg/kubelet/kuberuntime/security_context_others.go (unexported there, so
// not importable): uid and username are the image's user as imageUser
// splits it.
func verifyRunAsNonRoot(pod *corev1.PodSpec, c *corev1.Container, uid *int64, username string) error {
	runAsNonRoot, runAsUser := effectiveRunAs(pod, c)
	if runAsNonRoot == nil || !*runAsNonRoot {
		return nil
	}
	if runAsUser != nil {
		if *runAsUser == 0 {
			return fmt.Errorf("container's runAsUser breaks non-root policy (container: %s)", c.Name)
		}
		return nil
	}
	switch {
	case uid == nil && len(username) > 0:
		return fmt.Errorf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root (container: %s)", username, c.Name)
	case uid != nil:
		if *uid == 0 {
			return fmt.Errorf("container has runAsNonRoot and image will run as root (container: %s)", c.Name)
		}
		// validation.IsValidUserID: 0 to MaxInt32.
		if *uid < 0 || *uid > math.MaxInt32 {
			return fmt.Errorf("container has runAsNonRoot and image has an invalid user id (%d). (Must be 1-(%d)) (container: %s)", *uid, math.MaxInt32, c.Name)
		}
		return nil
	default:
		return nil
	}
}

// TestVerifyRunAsNonRootIsTheKubelets: the port gives the kubelet's answers
// on the cases of its own test (TestVerifyRunAsNonRoot in the same
// package), among them the one that stopped every pod of issue 37.
func TestVerifyRunAsNonRootIsTheKubelets(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	root, user := int64(0), int64(1000)
	for _, tc := range []struct {
		name         string
		podNonRoot   *bool
		podUser      *int64
		ctrUser      *int64
		imageUser    string
		fails        bool
		errorMention string
	}{
		{name: "runAsNonRoot unset", imageUser: "0"},
		{name: "runAsNonRoot false", podNonRoot: &no, imageUser: "0"},
		{name: "image user a name", podNonRoot: &yes, imageUser: "app", fails: true, errorMention: "non-numeric user (app)"},
		{name: "image user a name and a group", podNonRoot: &yes, imageUser: "app:app", fails: true, errorMention: "non-numeric user (app)"},
		{name: "image user root", podNonRoot: &yes, imageUser: "0", fails: true, errorMention: "will run as root"},
		{name: "image user numeric", podNonRoot: &yes, imageUser: "10001:10001"},
		{name: "runAsUser over a named image user", podNonRoot: &yes, podUser: &user, imageUser: "app"},
		{name: "runAsUser 0", podNonRoot: &yes, podUser: &root, imageUser: "10001", fails: true, errorMention: "breaks non-root policy"},
		{name: "container runAsUser over the pod's", podNonRoot: &yes, podUser: &user, ctrUser: &root, imageUser: "10001", fails: true},
		{name: "no image user", podNonRoot: &yes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: tc.podNonRoot, RunAsUser: tc.podUser}}
			c := &corev1.Container{Name: "c", SecurityContext: &corev1.SecurityContext{RunAsUser: tc.ctrUser}}
			uid, name := imageUser(tc.imageUser)
			err := verifyRunAsNonRoot(pod, c, uid, name)
			if !tc.fails {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.errorMention)
		})
	}
}

// podTemplates returns every pod template an overlay renders, by owner.
func podTemplates(t *testing.T, objs []object) map[string]corev1.PodTemplateSpec {
	t.Helper()
	out := map[string]corev1.PodTemplateSpec{}
	for _, o := range objs {
		switch o.kind() {
		case "apps/v1/Deployment", "apps/v1/StatefulSet", "apps/v1/DaemonSet":
			var d appsv1.Deployment // the template sits at the same path in all three
			decode(t, o, &d)
			out[o.String()] = d.Spec.Template
		case "batch/v1/Job":
			var j struct {
				Spec struct{ Template corev1.PodTemplateSpec }
			}
			decode(t, o, &j)
			out[o.String()] = j.Spec.Template
		}
	}
	require.NotEmpty(t, out)
	return out
}

func allContainers(spec *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

// pin is one entry of an overlay's `images`.
type pin struct {
	Name, NewName, NewTag string
}

func (p pin) image() string { return p.NewName + ":" + p.NewTag }

// overlayPins reads the images an overlay's kustomization.yaml pins.
func overlayPins(t *testing.T, overlay string) []pin {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "k8s", "overlays", overlay, "kustomization.yaml"))
	require.NoError(t, err)
	var k struct {
		Images []struct {
			Name    string `json:"name"`
			NewName string `json:"newName"`
			NewTag  string `json:"newTag"`
		} `json:"images"`
	}
	require.NoError(t, yaml.Unmarshal(b, &k))
	var out []pin
	for _, i := range k.Images {
		out = append(out, pin{i.Name, i.NewName, i.NewTag})
	}
	return out
}

// TestPodsStartAsNonRoot: every container of every pod of both overlays
// passes the kubelet's runAsNonRoot check against the user of the image it
// runs, both with the pod's runAsUser and without it (the image alone must
// prove it is not root: a pod spec, a `docker run` or a debug container
// that leaves runAsUser out still starts); and the pods of the project's
// images run as the image's own uid, so that what the image owns and the
// volumes fsGroup gives it agree. Images not built here (Mailpit) must set
// a numeric runAsUser in the pod.
func TestPodsStartAsNonRoot(t *testing.T) {
	t.Parallel()
	instructions := dockerfile(t)
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			users := map[string]string{} // rendered image -> its USER
			for _, p := range overlayPins(t, overlay) {
				stage, ok := imageStages[p.Name]
				require.True(t, ok, "%s: an image this repository builds", p.Name)
				users[p.image()] = stageUser(instructions, stage(instructions))
			}
			for owner, tmpl := range podTemplates(t, render(t, overlay)) {
				spec := tmpl.Spec
				for _, c := range allContainers(&spec) {
					what := owner + " container " + c.Name
					nonRoot, runAs := effectiveRunAs(&spec, c)
					require.True(t, nonRoot != nil && *nonRoot, "%s: runAsNonRoot", what)
					u, built := users[c.Image]
					if !built {
						require.NotNil(t, runAs, "%s: %s is not built here: the pod names its uid", what, c.Image)
						require.NoError(t, verifyRunAsNonRoot(&spec, c, nil, ""), what)
						continue
					}
					uid, name := imageUser(u)
					require.NoError(t, verifyRunAsNonRoot(&spec, c, uid, name), "%s (image USER %q)", what, u)
					bare := spec.DeepCopy()
					if bare.SecurityContext != nil {
						bare.SecurityContext.RunAsUser = nil
					}
					bareC := c.DeepCopy()
					if bareC.SecurityContext != nil {
						bareC.SecurityContext.RunAsUser = nil
					}
					require.NoError(t, verifyRunAsNonRoot(bare, bareC, uid, name),
						"%s: the image's USER %q alone must pass runAsNonRoot (the Dockerfile's stages end USER 10001:10001)", what, u)
					require.NotNil(t, runAs, what)
					require.Equal(t, *uid, *runAs, "%s: the pod runs as the image's uid", what)
					require.NotNil(t, spec.SecurityContext.FSGroup, "%s: fsGroup", what)
				}
			}
		})
	}
}

// TestOverlayImagesArePinned: each overlay runs exactly the images its
// `images` entries pin (repository and tag), on every container and init
// container of the project's processes; no container runs a :latest or an
// untagged image.
func TestOverlayImagesArePinned(t *testing.T) {
	t.Parallel()
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			pins := overlayPins(t, overlay)
			require.NotEmpty(t, pins)
			byName := map[string]pin{}
			for _, p := range pins {
				require.NotEmpty(t, p.NewTag, "%s: a tag", p.Name)
				require.NotEqual(t, "latest", p.NewTag, p.Name)
				byName[p.NewName] = p
			}
			used := map[string]bool{}
			for owner, tmpl := range podTemplates(t, render(t, overlay)) {
				spec := tmpl.Spec
				for _, c := range allContainers(&spec) {
					repo, tag, ok := strings.Cut(c.Image, ":")
					require.True(t, ok && tag != "" && tag != "latest", "%s %s: image %q has a tag, not latest", owner, c.Name, c.Image)
					if p, ok := byName[repo]; ok {
						require.Equal(t, p.image(), c.Image, "%s %s: the overlay's pin", owner, c.Name)
						used[p.Name] = true
					}
					if slices.Contains([]string{"api", "dispatcher", "worker", "migrate"}, firstOr(c.Command)) {
						require.Equal(t, pinNamed(t, pins, "checkout").image(), c.Image, "%s %s runs the checkout pin", owner, c.Name)
					}
				}
			}
			for _, p := range pins {
				require.True(t, used[p.Name], "%s: the pin of %s matches a container", overlay, p.Name)
			}
		})
	}
}

func firstOr(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func pinNamed(t *testing.T, pins []pin, name string) pin {
	t.Helper()
	for _, p := range pins {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no pin for %s", name)
	return pin{}
}

// processes are the Deployments that run the service's code.
var processes = []string{"checkout-api", "checkout-dispatcher", "checkout-worker"}

// TestMigrationsRunBeforeTheCodeServes: no process starts before the
// migrations its image embeds are applied: each runs the migrate command of
// its own image as its first init container, on the primary directly; and
// no Job holds an immutable pod template that the next apply with a new
// image would be refused for.
func TestMigrationsRunBeforeTheCodeServes(t *testing.T) {
	t.Parallel()
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			objs := render(t, overlay)
			for _, o := range objs {
				require.NotEqual(t, "batch/v1/Job", o.kind(), "%s: a Job's template is immutable", o)
			}
			deps := deployments(t, objs)
			for _, name := range processes {
				d, ok := deps[name]
				require.True(t, ok, name)
				spec := d.Spec.Template.Spec
				require.NotEmpty(t, spec.InitContainers, "%s: the migrations before the process", name)
				m := spec.InitContainers[0]
				require.Equal(t, []string{"migrate"}, m.Command, name)
				require.Equal(t, spec.Containers[0].Image, m.Image, "%s: the migrations of the code it starts", name)
				require.Equal(t, "secret:checkout-db-app/uri", effectiveEnv(t, objs, m)["DATABASE_URL"],
					"%s: migrate on the primary directly (its session advisory lock), not through PgBouncer", name)
				require.NotEqual(t, "true", effectiveEnv(t, objs, spec.Containers[0])["MIGRATE_ON_START"], name)
			}
		})
	}
}

// crOf returns the spec of the only custom resource of kind named name.
func crOf(t *testing.T, objs []object, kind, name string) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o.kind() == kind && o.name() == name {
			return o["spec"].(map[string]any)
		}
	}
	t.Fatalf("no %s %s", kind, name)
	return nil
}

// TestRedisWritesItsVolumes: the Redis image runs as uid 1000, and a cloud
// block volume mounts owned by root; with persistence on, the pods set that
// uid and an fsGroup so Redis can write its data and nodes.conf, as every
// example of the redis-operator does.
func TestRedisWritesItsVolumes(t *testing.T) {
	t.Parallel()
	for _, overlay := range overlays {
		redis := crOf(t, render(t, overlay), "redis.redis.opstreelabs.in/v1beta2/RedisCluster", "checkout-redis")
		if redis["persistenceEnabled"] != true {
			continue
		}
		psc, ok := redis["podSecurityContext"].(map[string]any)
		require.True(t, ok, "%s: podSecurityContext", overlay)
		require.EqualValues(t, 1000, psc["runAsUser"], "%s: the image's uid", overlay)
		require.EqualValues(t, 1000, psc["fsGroup"], "%s: fsGroup", overlay)
	}
}

// podAntiAffinityRequired reports whether an affinity keeps two pods
// matching labels off one node.
func podAntiAffinityRequired(t *testing.T, affinity any, labels map[string]string) bool {
	t.Helper()
	var a corev1.Affinity
	b, _ := yaml.Marshal(affinity)
	require.NoError(t, yaml.Unmarshal(b, &a))
	if a.PodAntiAffinity == nil {
		return false
	}
	for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		if term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector != nil && matches(term.LabelSelector.MatchLabels, labels) {
			return true
		}
	}
	return false
}

// pdbFor returns the PodDisruptionBudget selecting labels, or nil.
func pdbFor(t *testing.T, objs []object, labels map[string]string) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o.kind() != "policy/v1/PodDisruptionBudget" {
			continue
		}
		spec := o["spec"].(map[string]any)
		sel, _ := spec["selector"].(map[string]any)
		ml := map[string]string{}
		for k, v := range sel["matchLabels"].(map[string]any) {
			ml[k] = fmt.Sprint(v)
		}
		if matches(ml, labels) {
			return spec
		}
	}
	return nil
}

// TestDataServicesAsTheirOperatorsAdvise: production's PostgreSQL,
// PgBouncer, RabbitMQ and Redis as their operators' production guidance
// has them.
func TestDataServicesAsTheirOperatorsAdvise(t *testing.T) {
	t.Parallel()
	objs := render(t, "production")

	// CloudNativePG: with ANY 1 of 2 standbys, failover only to a standby
	// the quorum proves current; never two instances on a node; WAL
	// archived by the Barman Cloud plugin to an ObjectStore, and a
	// ScheduledBackup through the same plugin.
	pg := crOf(t, objs, "postgresql.cnpg.io/v1/Cluster", "checkout-db")
	require.Equal(t, true, field(t, pg, "postgresql", "synchronous", "failoverQuorum"))
	require.Equal(t, true, field(t, pg, "affinity", "enablePodAntiAffinity"))
	require.Equal(t, "required", field(t, pg, "affinity", "podAntiAffinityType"))
	plugins := field(t, pg, "plugins").([]any)
	require.Len(t, plugins, 1)
	plugin := plugins[0].(map[string]any)
	require.Equal(t, "barman-cloud.cloudnative-pg.io", plugin["name"])
	require.Equal(t, true, plugin["isWALArchiver"])
	store := field(t, plugin, "parameters", "barmanObjectName")
	require.NotEmpty(t, crOf(t, objs, "barmancloud.cnpg.io/v1/ObjectStore", fmt.Sprint(store)))
	var backup map[string]any
	for _, o := range objs {
		if o.kind() == "postgresql.cnpg.io/v1/ScheduledBackup" {
			backup = o["spec"].(map[string]any)
		}
	}
	require.NotNil(t, backup, "a ScheduledBackup")
	require.Equal(t, "checkout-db", field(t, backup, "cluster", "name"))
	require.Equal(t, "plugin", backup["method"])
	require.Equal(t, "barman-cloud.cloudnative-pg.io", field(t, backup, "pluginConfiguration", "name"))

	// PgBouncer: every query passes it. Three instances on three nodes, a
	// budget, and resources.
	pooler := crOf(t, objs, "postgresql.cnpg.io/v1/Pooler", "checkout-db-pooler-rw")
	require.EqualValues(t, 3, pooler["instances"])
	poolerLabels := map[string]string{"cnpg.io/poolerName": "checkout-db-pooler-rw"}
	require.True(t, podAntiAffinityRequired(t, field(t, pooler, "template", "spec", "affinity"), poolerLabels))
	require.NotNil(t, pdbFor(t, objs, poolerLabels), "a PodDisruptionBudget for PgBouncer")
	var bouncer corev1.Container
	b, _ := yaml.Marshal(field(t, pooler, "template", "spec", "containers").([]any)[0])
	require.NoError(t, yaml.Unmarshal(b, &bouncer))
	require.Equal(t, "pgbouncer", bouncer.Name)
	require.False(t, bouncer.Resources.Requests.Cpu().IsZero() || bouncer.Resources.Limits.Memory().IsZero(), "PgBouncer's resources")

	// RabbitMQ: quorum queues need two of three; integral CPUs with the
	// limit at the request, as the operator's production example.
	mq := crOf(t, objs, "rabbitmq.com/v1beta1/RabbitmqCluster", "checkout-mq")
	mqLabels := map[string]string{"app.kubernetes.io/name": "checkout-mq"}
	require.True(t, podAntiAffinityRequired(t, mq["affinity"], mqLabels))
	pdb := pdbFor(t, objs, mqLabels)
	require.NotNil(t, pdb, "a PodDisruptionBudget for RabbitMQ")
	require.EqualValues(t, 1, pdb["maxUnavailable"])
	var res corev1.ResourceRequirements
	b, _ = yaml.Marshal(mq["resources"])
	require.NoError(t, yaml.Unmarshal(b, &res))
	require.GreaterOrEqual(t, res.Requests.Cpu().MilliValue(), int64(4000), "RabbitMQ's CPU")
	require.Equal(t, 0, res.Requests.Cpu().Cmp(*res.Limits.Cpu()), "RabbitMQ's CPU limit is its request")

	// Redis: maxmemory under the memory limit, nodes.conf on a volume.
	redis := crOf(t, objs, "redis.redis.opstreelabs.in/v1beta2/RedisCluster", "checkout-redis")
	for _, role := range []string{"redisLeader", "redisFollower"} {
		pct := field(t, redis, role, "redisConfig", "maxMemoryPercentOfLimit")
		require.Greater(t, pct.(float64), 0.0, role)
		require.LessOrEqual(t, pct.(float64), 90.0, role)
	}
	require.NotNil(t, field(t, redis, "kubernetesConfig", "resources", "limits", "memory"))
	require.Equal(t, true, field(t, redis, "storage", "nodeConfVolume"))
	require.NotNil(t, field(t, redis, "storage", "nodeConfVolumeClaimTemplate"))
}

// preStopSeconds is the pause a container's preStop takes.
func preStopSeconds(c corev1.Container) int64 {
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		return 0
	}
	return c.Lifecycle.PreStop.Sleep.Seconds
}

// TestPlatformBasics: what a platform review asks of both overlays: a
// namespace with Pod Security Admission labels, no service account token in
// the service's pods, a NetworkPolicy over each, a grace period with margin
// over the preStop pause and SHUTDOWN_TIMEOUT, GOMEMLIMIT under the memory
// limit, budgets that let a broken pod go, an autoscaled api, an Ingress of
// /v1/ only, Prometheus selector labels; and production's mail settings not
// an example's.
func TestPlatformBasics(t *testing.T) {
	t.Parallel()
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			objs := render(t, overlay)
			var ns corev1.Namespace
			for _, o := range objs {
				if o.kind() == "v1/Namespace" {
					decode(t, o, &ns)
				}
			}
			require.NotEmpty(t, ns.Name, "the overlay renders its namespace")
			require.Equal(t, "baseline", ns.Labels["pod-security.kubernetes.io/enforce"])
			require.Equal(t, "restricted", ns.Labels["pod-security.kubernetes.io/warn"])
			require.Equal(t, "restricted", ns.Labels["pod-security.kubernetes.io/audit"])

			deps := deployments(t, objs)
			for _, name := range processes {
				d := deps[name]
				spec := d.Spec.Template.Spec
				require.NotNil(t, spec.AutomountServiceAccountToken, name)
				require.False(t, *spec.AutomountServiceAccountToken, "%s: no token", name)
				require.Equal(t, "checkout", spec.ServiceAccountName, name)
				require.True(t, networkPolicySelects(t, objs, d.Spec.Template.Labels), "%s: a NetworkPolicy", name)

				c := spec.Containers[0]
				env := effectiveEnv(t, objs, c)
				shutdown := 20 * time.Second // SHUTDOWN_TIMEOUT's default (internal/config)
				if v := env["SHUTDOWN_TIMEOUT"]; v != "" {
					var err error
					shutdown, err = time.ParseDuration(v)
					require.NoError(t, err)
				}
				need := time.Duration(preStopSeconds(c))*time.Second + shutdown
				require.NotNil(t, spec.TerminationGracePeriodSeconds, name)
				grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
				require.GreaterOrEqual(t, grace, need+10*time.Second, "%s: grace %s, preStop and drain %s: margin", name, grace, need)

				limit := c.Resources.Limits.Memory()
				require.False(t, limit.IsZero(), name)
				goMem, err := goMemLimit(env["GOMEMLIMIT"])
				require.NoError(t, err, "%s: GOMEMLIMIT %q", name, env["GOMEMLIMIT"])
				require.Less(t, goMem, limit.Value()*95/100, "%s: GOMEMLIMIT under the limit", name)
				require.Greater(t, goMem, limit.Value()*70/100, "%s: GOMEMLIMIT near the limit", name)
			}
			for _, o := range objs {
				switch o.kind() {
				case "v1/ServiceAccount":
					require.Equal(t, false, o["automountServiceAccountToken"], o.String())
				case "policy/v1/PodDisruptionBudget":
					require.Equal(t, "AlwaysAllow", field(t, map[string]any(o), "spec", "unhealthyPodEvictionPolicy"), o.String())
				case "networking.k8s.io/v1/Ingress":
					for _, rule := range field(t, map[string]any(o), "spec", "rules").([]any) {
						for _, p := range field(t, rule, "http", "paths").([]any) {
							require.Equal(t, "/v1/", field(t, p, "path"), o.String())
							require.Equal(t, "checkout-api", field(t, p, "backend", "service", "name"), o.String())
						}
					}
				case "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule":
					labels, _ := field(t, map[string]any(o), "metadata").(map[string]any)["labels"].(map[string]any)
					require.Equal(t, prometheusSelector, labels["release"], "%s: the label Prometheus selects", o)
				}
			}
			hpa := false
			for _, o := range objs {
				if o.kind() == "autoscaling/v2/HorizontalPodAutoscaler" && field(t, map[string]any(o), "spec", "scaleTargetRef", "name") == "checkout-api" {
					hpa = true
				}
			}
			require.True(t, hpa, "the api autoscales")
			require.Nil(t, deps["checkout-api"].Spec.Replicas, "the autoscaler's count: an apply must not reset it")

			if overlay == "production" {
				worker := deps["checkout-worker"].Spec.Template.Spec.Containers[0]
				env := effectiveEnv(t, objs, worker)
				for _, k := range []string{"SMTP_ADDR", "SMTP_FROM"} {
					require.NotContains(t, env[k], "example.com", "%s: production ships no example's relay", k)
				}
				// The placeholder is one the worker refuses at start
				// (cmd/worker: SMTP_ADDR is host:port).
				_, _, err := net.SplitHostPort(env["SMTP_ADDR"])
				require.Error(t, err, "SMTP_ADDR %q: a placeholder the worker refuses, until filled", env["SMTP_ADDR"])
			}
		})
	}
}

// goMemLimit parses GOMEMLIMIT as the Go runtime does (runtime/debug,
// SetMemoryLimit): a number of bytes with an optional B, KiB, MiB, GiB or
// TiB suffix.
func goMemLimit(s string) (int64, error) {
	for i, unit := range []string{"TiB", "GiB", "MiB", "KiB", "B"} {
		if n, ok := strings.CutSuffix(s, unit); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v << (10 * (4 - i)), err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// prometheusSelector is the release label the ServiceMonitors and the
// PrometheusRule carry: kube-prometheus-stack's Prometheus selects its
// release's label by default (docs/kubernetes.md).
const prometheusSelector = "kube-prometheus-stack"

func networkPolicySelects(t *testing.T, objs []object, labels map[string]string) bool {
	t.Helper()
	for _, o := range objs {
		if o.kind() != "networking.k8s.io/v1/NetworkPolicy" {
			continue
		}
		var np struct {
			Spec struct {
				PodSelector struct {
					MatchLabels      map[string]string
					MatchExpressions []struct {
						Key, Operator string
						Values        []string
					}
				}
			}
		}
		decode(t, o, &np)
		sel := np.Spec.PodSelector
		ok := len(sel.MatchLabels) > 0 || len(sel.MatchExpressions) > 0
		if len(sel.MatchLabels) > 0 && !matches(sel.MatchLabels, labels) {
			ok = false
		}
		for _, e := range sel.MatchExpressions {
			if e.Operator != "In" || !slices.Contains(e.Values, labels[e.Key]) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// pgbouncerParameters are the PgBouncer parameters CloudNativePG's pooler
// webhook accepts; any other is refused at admission ("Invalid or reserved
// parameter"). From AllowedPgbouncerGenericConfigurationParameters in
// cloudnative-pg v1.30.0, internal/webhook/v1/pooler_webhook.go (internal,
// so copied rather than imported).
var pgbouncerParameters = []string{
	"application_name_add_host", "auth_type", "autodb_idle_timeout", "cancel_wait_timeout",
	"client_idle_timeout", "client_login_timeout", "client_tls_ciphers", "client_tls_sslmode",
	"client_tls13_ciphers", "default_pool_size", "disable_pqexec", "dns_max_ttl", "dns_nxdomain_ttl",
	"idle_transaction_timeout", "ignore_startup_parameters", "listen_backlog", "log_connections",
	"log_disconnections", "log_pooler_errors", "log_stats", "max_client_conn", "max_db_connections",
	"max_packet_size", "max_prepared_statements", "max_user_connections", "min_pool_size", "pkt_buf",
	"query_timeout", "query_wait_timeout", "reserve_pool_size", "reserve_pool_timeout", "sbuf_loopcnt",
	"server_check_delay", "server_check_query", "server_connect_timeout", "server_fast_close",
	"server_idle_timeout", "server_lifetime", "server_login_retry", "server_reset_query",
	"server_reset_query_always", "server_round_robin", "server_tls_ciphers", "server_tls13_ciphers",
	"server_tls_protocols", "server_tls_sslmode", "stats_period", "suspend_timeout", "tcp_defer_accept",
	"tcp_socket_buffer", "tcp_keepalive", "tcp_keepcnt", "tcp_keepidle", "tcp_keepintvl",
	"tcp_user_timeout", "track_extra_parameters", "verbose",
}

// cnpgAdmission returns what CloudNativePG's validating webhooks (v1.30.0,
// internal/webhook/v1) refuse in a Cluster or a Pooler spec, for the rules
// the overlays touch: the pooler's parameter allow-list
// (validatePgbouncerGenericParameters), the synchronous replica count
// (validateSynchronousReplicaConfiguration: number below the instances
// plus the named standbys) and the failover quorum
// (validateFailoverQuorum: synchronous replication, and a number above the
// named standbys).
func cnpgAdmission(kind string, spec map[string]any) []string {
	var refused []string
	switch kind {
	case "postgresql.cnpg.io/v1/Pooler":
		params, _ := spec["pgbouncer"].(map[string]any)["parameters"].(map[string]any)
		for p := range params {
			if !slices.Contains(pgbouncerParameters, p) {
				refused = append(refused, "spec.pgbouncer.parameters: "+p+": Invalid or reserved parameter")
			}
		}
	case "postgresql.cnpg.io/v1/Cluster":
		pg, _ := spec["postgresql"].(map[string]any)
		sync, _ := pg["synchronous"].(map[string]any)
		if sync == nil {
			break
		}
		named := len(asList(sync["standbyNamesPre"])) + len(asList(sync["standbyNamesPost"]))
		number, instances := asInt(sync["number"]), asInt(spec["instances"])
		if number >= instances+named {
			refused = append(refused, "spec.postgresql.synchronous: the number of synchronous replicas must be less than the total number of instances and the provided standby names")
		}
		if sync["failoverQuorum"] == true && number <= named {
			refused = append(refused, "spec.postgresql.synchronous: failoverQuorum needs number above the named standbys")
		}
	}
	slices.Sort(refused)
	return refused
}

func asList(v any) []any { l, _ := v.([]any); return l }

func asInt(v any) int {
	switch x := v.(type) {
	case float64:
		return int(x)
	case int:
		return x
	}
	return 0
}

// TestCloudNativePGAdmitsTheOverlays: CloudNativePG's webhooks, which a
// bare API server does not run, admit each overlay's Cluster and Pooler;
// and they refuse what the rules are about (a parameter off the
// allow-list, as many synchronous replicas as instances, a failover quorum
// without synchronous replication).
func TestCloudNativePGAdmitsTheOverlays(t *testing.T) {
	t.Parallel()
	for _, overlay := range overlays {
		objs := render(t, overlay)
		cluster := crOf(t, objs, "postgresql.cnpg.io/v1/Cluster", "checkout-db")
		pooler := crOf(t, objs, "postgresql.cnpg.io/v1/Pooler", "checkout-db-pooler-rw")
		require.Empty(t, cnpgAdmission("postgresql.cnpg.io/v1/Cluster", cluster), overlay)
		require.Empty(t, cnpgAdmission("postgresql.cnpg.io/v1/Pooler", pooler), overlay)

		o := deepCopy(t, object{"spec": pooler})
		set(o, []string{"spec", "pgbouncer", "parameters", "pool_mode"}, "session")
		require.Len(t, cnpgAdmission("postgresql.cnpg.io/v1/Pooler", o["spec"].(map[string]any)), 1, "pool_mode is the operator's")

		o = deepCopy(t, object{"spec": cluster})
		set(o, []string{"spec", "postgresql", "synchronous", "number"}, o["spec"].(map[string]any)["instances"])
		require.Len(t, cnpgAdmission("postgresql.cnpg.io/v1/Cluster", o["spec"].(map[string]any)), 1, "%s: as many synchronous replicas as instances", overlay)

		o = deepCopy(t, object{"spec": cluster})
		set(o, []string{"spec", "postgresql", "synchronous", "standbyNamesPre"}, []any{"a"})
		require.Len(t, cnpgAdmission("postgresql.cnpg.io/v1/Cluster", o["spec"].(map[string]any)), 1, "%s: a quorum over a named standby only", overlay)
	}
}
