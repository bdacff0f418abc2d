package deploy_test

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/onceonly/checkout/internal/auth"
	"github.com/onceonly/checkout/internal/webhooks"
)

// overlays are the deployments deploy/k8s ships.
var overlays = []string{"dev", "production"}

// object is one rendered Kubernetes object, as JSON would decode it.
type object map[string]any

func (o object) kind() string { return fmt.Sprint(o["apiVersion"]) + "/" + fmt.Sprint(o["kind"]) }

func (o object) name() string {
	md, _ := o["metadata"].(map[string]any)
	return fmt.Sprint(md["name"])
}

func (o object) String() string { return o.kind() + " " + o.name() }

// render builds an overlay as `kubectl apply -k` would, with kustomize's
// own library, in-process.
func render(t *testing.T, overlay string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resMap, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, "deploy", "k8s", "overlays", overlay))
	require.NoError(t, err, "kustomize build deploy/k8s/overlays/%s", overlay)
	var objs []object
	for _, r := range resMap.Resources() {
		y, err := r.AsYAML()
		require.NoError(t, err)
		var o object
		require.NoError(t, yaml.Unmarshal(y, &o))
		objs = append(objs, o)
	}
	require.NotEmpty(t, objs)
	return objs
}

// core are the built-in kinds the overlays use, each with the k8s.io/api
// type it must decode into.
var core = map[string]func() any{
	"apps/v1/Deployment":                     func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                           func() any { return &batchv1.Job{} },
	"v1/Service":                             func() any { return &corev1.Service{} },
	"v1/ConfigMap":                           func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                              func() any { return &corev1.Secret{} },
	"policy/v1/PodDisruptionBudget":          func() any { return &policyv1.PodDisruptionBudget{} },
	"v1/Namespace":                           func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":                      func() any { return &corev1.ServiceAccount{} },
	"networking.k8s.io/v1/NetworkPolicy":     func() any { return &networkingv1.NetworkPolicy{} },
	"networking.k8s.io/v1/Ingress":           func() any { return &networkingv1.Ingress{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
}

// crds maps each custom kind the overlays use to its CRD in testdata/crds.
var crds = map[string]string{
	"postgresql.cnpg.io/v1/Cluster":                   "cnpg-clusters.yaml",
	"postgresql.cnpg.io/v1/Pooler":                    "cnpg-poolers.yaml",
	"postgresql.cnpg.io/v1/ScheduledBackup":           "cnpg-scheduledbackups.yaml",
	"barmancloud.cnpg.io/v1/ObjectStore":              "plugin-barman-cloud-objectstores.yaml",
	"rabbitmq.com/v1beta1/RabbitmqCluster":            "rabbitmq-rabbitmqclusters.yaml",
	"redis.redis.opstreelabs.in/v1beta2/RedisCluster": "redis-operator-redisclusters.yaml",
	"monitoring.coreos.com/v1/ServiceMonitor":         "prometheus-operator-servicemonitors.yaml",
	"monitoring.coreos.com/v1/PrometheusRule":         "prometheus-operator-prometheusrules.yaml",
}

// validator checks rendered objects: built-in kinds by strict decoding into
// k8s.io/api's types, custom resources against their CRD's schema.
type validator struct {
	schemas map[string]*spec.Schema
}

func newValidator(t *testing.T) *validator {
	t.Helper()
	v := &validator{schemas: map[string]*spec.Schema{}}
	for kind, file := range crds {
		v.schemas[kind] = crdSchema(t, kind, filepath.Join("testdata", "crds", file))
	}
	return v
}

// crdSchema reads the openAPIV3Schema of kind's version from a CRD file,
// made strict as `kubectl apply` (server-side field validation, Strict)
// treats it: an object schema with properties accepts no other field unless
// it says x-kubernetes-preserve-unknown-fields.
func crdSchema(t *testing.T, kind, file string) *spec.Schema {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var crd struct {
		Spec struct {
			Group    string
			Names    struct{ Kind string }
			Versions []struct {
				Name   string
				Schema struct {
					OpenAPIV3Schema json.RawMessage `json:"openAPIV3Schema"`
				}
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(b, &crd), file)
	for _, ver := range crd.Spec.Versions {
		if crd.Spec.Group+"/"+ver.Name+"/"+crd.Spec.Names.Kind != kind {
			continue
		}
		var s spec.Schema
		require.NoError(t, json.Unmarshal(ver.Schema.OpenAPIV3Schema, &s), file)
		closeSchema(&s)
		return &s
	}
	t.Fatalf("%s: no version for %s", file, kind)
	return nil
}

// closeSchema forbids unknown fields in every object schema that lists its
// properties, as the API server's strict field validation does.
func closeSchema(s *spec.Schema) {
	if s == nil {
		return
	}
	preserve, _ := s.Extensions.GetBool("x-kubernetes-preserve-unknown-fields")
	if len(s.Properties) > 0 && s.AdditionalProperties == nil && !preserve {
		s.AdditionalProperties = &spec.SchemaOrBool{Allows: false}
	}
	for k, p := range s.Properties {
		closeSchema(&p)
		s.Properties[k] = p
	}
	if s.Items != nil {
		closeSchema(s.Items.Schema)
		for i := range s.Items.Schemas {
			closeSchema(&s.Items.Schemas[i])
		}
	}
	if s.AdditionalProperties != nil {
		closeSchema(s.AdditionalProperties.Schema)
	}
	for _, list := range [][]spec.Schema{s.AllOf, s.AnyOf, s.OneOf} {
		for i := range list {
			closeSchema(&list[i])
		}
	}
}

// validate returns what is wrong with o, or nil.
func (v *validator) validate(o object) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if newType, ok := core[o.kind()]; ok {
		strict, err := kjson.UnmarshalStrict(b, newType())
		if err != nil {
			return fmt.Errorf("%s: %w", o, err)
		}
		if len(strict) > 0 {
			return fmt.Errorf("%s: %v", o, joinErrs(strict))
		}
		return semantics(o, newType)
	}
	s, ok := v.schemas[o.kind()]
	if !ok {
		return fmt.Errorf("%s: a kind with no schema here (add its CRD to testdata/crds)", o)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	res := validate.NewSchemaValidator(s, nil, "", strfmt.Default).Validate(doc)
	if !res.IsValid() {
		return fmt.Errorf("%s: %v", o, joinErrs(res.Errors))
	}
	return nil
}

func joinErrs(errs []error) string {
	var s []string
	for _, e := range errs {
		s = append(s, e.Error())
	}
	return strings.Join(s, "; ")
}

// semantics checks what the API server would refuse although the object
// decodes: a workload whose selector misses its pods, a container without an
// image or a probe on a port it does not name.
func semantics(o object, newType func() any) error {
	b, _ := json.Marshal(o)
	typed := newType()
	if err := json.Unmarshal(b, typed); err != nil {
		return err
	}
	var pod *corev1.PodTemplateSpec
	switch x := typed.(type) {
	case *appsv1.Deployment:
		if x.Spec.Selector == nil || !matches(x.Spec.Selector.MatchLabels, x.Spec.Template.Labels) {
			return fmt.Errorf("%s: the selector does not select the pod template's labels", o)
		}
		pod = &x.Spec.Template
	case *batchv1.Job:
		pod = &x.Spec.Template
		if p := pod.Spec.RestartPolicy; p != corev1.RestartPolicyOnFailure && p != corev1.RestartPolicyNever {
			return fmt.Errorf("%s: a Job's restartPolicy is OnFailure or Never, not %q", o, p)
		}
	case *corev1.Service:
		for _, p := range x.Spec.Ports {
			if p.Port < 1 || p.Port > 65535 {
				return fmt.Errorf("%s: port %d", o, p.Port)
			}
		}
	case *policyv1.PodDisruptionBudget:
		if (x.Spec.MinAvailable == nil) == (x.Spec.MaxUnavailable == nil) {
			return fmt.Errorf("%s: exactly one of minAvailable and maxUnavailable", o)
		}
	}
	if pod == nil {
		return nil
	}
	if len(pod.Spec.Containers) == 0 {
		return fmt.Errorf("%s: no container", o)
	}
	for _, c := range pod.Spec.Containers {
		if c.Image == "" {
			return fmt.Errorf("%s: container %s has no image", o, c.Name)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			return fmt.Errorf("%s: container %s requests no cpu or memory", o, c.Name)
		}
		for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.IntValue() != 0 {
				continue
			}
			if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.HTTPGet.Port.StrVal }) {
				return fmt.Errorf("%s: container %s probes port %q, which it does not name", o, c.Name, p.HTTPGet.Port.StrVal)
			}
		}
	}
	return nil
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestOverlaysRenderValidObjects renders every overlay and validates every
// object it holds.
func TestOverlaysRenderValidObjects(t *testing.T) {
	t.Parallel()
	v := newValidator(t)
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			for _, o := range render(t, overlay) {
				require.NoError(t, v.validate(o))
			}
		})
	}
}

// developmentSecrets are the development keys (CONTRACT.md): the tenants'
// keys the api refuses with APP_ENV=production (auth.DefaultKeys), its
// webhook secret, and the Stripe key the emulator takes.
func developmentSecrets() []string {
	var out []string
	for _, pair := range strings.Split(auth.DefaultKeys, ",") {
		_, key, _ := strings.Cut(pair, ":")
		out = append(out, strings.TrimSpace(key))
	}
	return append(out, webhooks.DefaultSecret, "sk_test_123")
}

// allStrings returns every string in o: keys, values, and the decoded values
// of a Secret's data.
func allStrings(o object) []string {
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				out = append(out, k)
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		case string:
			out = append(out, x)
			if b, err := base64.StdEncoding.DecodeString(x); err == nil {
				out = append(out, string(b))
			}
		}
	}
	walk(map[string]any(o))
	return out
}

// leakedSecrets names each development secret that objs contain.
func leakedSecrets(objs []object) []string {
	var found []string
	for _, o := range objs {
		for _, s := range allStrings(o) {
			for _, secret := range developmentSecrets() {
				if strings.Contains(s, secret) {
					found = append(found, o.String()+" holds "+secret)
				}
			}
		}
	}
	return found
}

// effectiveEnv resolves a container's environment as the kubelet would from
// the rendered ConfigMaps: envFrom first, env over it. Values from Secrets
// come back as "secret:NAME/KEY".
func effectiveEnv(t *testing.T, objs []object, c corev1.Container) map[string]string {
	t.Helper()
	configMaps := map[string]map[string]string{}
	for _, o := range objs {
		if o.kind() == "v1/ConfigMap" {
			var cm corev1.ConfigMap
			decode(t, o, &cm)
			configMaps[cm.Name] = cm.Data
		}
	}
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		require.NotNil(t, from.ConfigMapRef, "%s: envFrom a ConfigMap", c.Name)
		data, ok := configMaps[from.ConfigMapRef.Name]
		require.True(t, ok, "%s: envFrom %s, which the overlay renders", c.Name, from.ConfigMapRef.Name)
		for k, v := range data {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	return env
}

func decode(t *testing.T, o object, into any) {
	t.Helper()
	b, err := json.Marshal(o)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, into))
}

// deployments returns the overlay's Deployments by name.
func deployments(t *testing.T, objs []object) map[string]appsv1.Deployment {
	t.Helper()
	out := map[string]appsv1.Deployment{}
	for _, o := range objs {
		if o.kind() == "apps/v1/Deployment" {
			var d appsv1.Deployment
			decode(t, o, &d)
			out[d.Name] = d
		}
	}
	return out
}

// TestProductionHasNoDevelopmentKey: the production overlay renders no
// development key anywhere (no Secret holds one; checkout-secrets is made by
// hand), runs no Stripe emulator, and runs the api with APP_ENV=production,
// in which it refuses the development keys and webhook secret at start.
// The dev overlay, which does carry them, proves the check finds them.
func TestProductionHasNoDevelopmentKey(t *testing.T) {
	t.Parallel()
	prod := render(t, "production")
	require.Empty(t, leakedSecrets(prod))
	require.NotEmpty(t, leakedSecrets(render(t, "dev")), "the check finds the dev overlay's keys")

	for name, d := range deployments(t, prod) {
		for _, c := range d.Spec.Template.Spec.Containers {
			require.NotContains(t, c.Command, "stripe-emulator", name)
			require.NotContains(t, c.Image, "emulator", name)
			env := effectiveEnv(t, prod, c)
			require.Equal(t, "production", env["APP_ENV"], "%s: APP_ENV", name)
			require.True(t, strings.HasPrefix(env["STRIPE_API_BASE"], "https://api.stripe.com"), "%s: STRIPE_API_BASE %q", name, env["STRIPE_API_BASE"])
		}
	}
	api := deployments(t, prod)["checkout-api"].Spec.Template.Spec.Containers[0]
	env := effectiveEnv(t, prod, api)
	require.Equal(t, "secret:checkout-secrets/CHECKOUT_API_KEYS", env["CHECKOUT_API_KEYS"])
	require.Equal(t, "secret:checkout-secrets/STRIPE_WEBHOOK_SECRET", env["STRIPE_WEBHOOK_SECRET"])
	for _, o := range prod {
		require.NotEqual(t, "v1/Secret", o.kind(), "production renders no Secret: %s", o)
	}

	dev := render(t, "dev")
	require.Contains(t, deployments(t, dev), "stripe-emulator")
	devAPI := deployments(t, dev)["checkout-api"].Spec.Template.Spec.Containers[0]
	require.Equal(t, "development", effectiveEnv(t, dev, devAPI)["APP_ENV"])
}

// TestDeploymentWiring checks the shape CONTRACT.md's Deployment section
// asks for, in every overlay: the migrate init container reaches the primary directly
// and the api does not migrate; the three processes reach Postgres through
// the transaction-pooling PgBouncer; each probes the /healthz and /readyz
// that its process serves on the port it serves them on; each has a
// PodDisruptionBudget and spreads over nodes; Postgres has a synchronous
// standby and RabbitMQ three nodes.
func TestDeploymentWiring(t *testing.T) {
	t.Parallel()
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			objs := render(t, overlay)
			byKind := map[string][]object{}
			for _, o := range objs {
				byKind[o.kind()] = append(byKind[o.kind()], o)
			}
			deps := deployments(t, objs)

			require.NotEmpty(t, deps["checkout-api"].Spec.Template.Spec.InitContainers)
			migrate := deps["checkout-api"].Spec.Template.Spec.InitContainers[0]
			require.Equal(t, []string{"migrate"}, migrate.Command)
			// The image's default target (what `docker build -t checkout .`
			// makes) ships the binary each process of the image runs.
			image := shipped(t, dockerfile(t), lastStage(dockerfile(t)))
			require.Contains(t, image, migrate.Command[0], "the default image ships migrate")
			for _, d := range deps {
				if c := d.Spec.Template.Spec.Containers[0]; c.Image == migrate.Image {
					require.Contains(t, image, c.Command[0], "the default image ships %s", c.Command[0])
				}
			}
			require.Equal(t, "secret:checkout-db-app/uri", effectiveEnv(t, objs, migrate)["DATABASE_URL"],
				"migrate connects to the primary (checkout-db-rw), not through PgBouncer")

			// METRICS_ADDR's port serves /healthz and /readyz for the
			// dispatcher and the worker; the api serves them on HTTP_ADDR.
			for name, probePort := range map[string]string{"checkout-api": "HTTP_ADDR", "checkout-dispatcher": "METRICS_ADDR", "checkout-worker": "METRICS_ADDR"} {
				d, ok := deps[name]
				require.True(t, ok, name)
				c := d.Spec.Template.Spec.Containers[0]
				env := effectiveEnv(t, objs, c)
				// cache_describe: pgx sends every statement unnamed, which any
				// PgBouncer in transaction pooling passes (README, "PgBouncer").
				require.Equal(t, "postgres://checkout-db-pooler-rw:5432/checkout?sslmode=require&default_query_exec_mode=cache_describe", env["DATABASE_URL"], name)
				require.Equal(t, "secret:checkout-db-app/password", env["PGPASSWORD"], name)
				require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path, name)
				require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path, name)
				port := containerPort(t, c, c.ReadinessProbe.HTTPGet.Port.StrVal)
				require.Equal(t, fmt.Sprintf(":%d", port), env[probePort], "%s probes the port %s names", name, probePort)
				require.Equal(t, port, containerPort(t, c, c.LivenessProbe.HTTPGet.Port.StrVal), name)
				require.NotEmpty(t, env["METRICS_ADDR"], "%s: /metrics off the public port", name)
				require.Equal(t, fmt.Sprintf(":%d", containerPort(t, c, "metrics")), env["METRICS_ADDR"], name)
				require.NotEmpty(t, d.Spec.Template.Spec.TopologySpreadConstraints, name)
				require.True(t, hasPDB(t, objs, d), "%s has a PodDisruptionBudget", name)
				if name == "checkout-api" {
					require.Equal(t, "false", env["MIGRATE_ON_START"], "the init container migrates")
				} else {
					require.Contains(t, env["AMQP_URL"], "checkout-mq-server-2.checkout-mq-nodes", name)
				}
			}

			pooler := field(t, byKind["postgresql.cnpg.io/v1/Pooler"], "spec")
			require.Equal(t, "transaction", field(t, pooler, "pgbouncer", "poolMode"))
			require.Equal(t, "rw", field(t, pooler, "type"))
			cluster := field(t, byKind["postgresql.cnpg.io/v1/Cluster"], "spec")
			require.EqualValues(t, 1, field(t, cluster, "postgresql", "synchronous", "number"))
			require.Equal(t, "required", field(t, cluster, "postgresql", "synchronous", "dataDurability"))
			require.EqualValues(t, 3, field(t, byKind["rabbitmq.com/v1beta1/RabbitmqCluster"], "spec", "replicas"))
			require.Len(t, byKind["redis.redis.opstreelabs.in/v1beta2/RedisCluster"], 1)
		})
	}
}

// field returns the value at path in the only object of objs, or in a map.
func field(t *testing.T, in any, path ...string) any {
	t.Helper()
	if objs, ok := in.([]object); ok {
		require.Len(t, objs, 1)
		in = map[string]any(objs[0])
	}
	for _, p := range path {
		m, ok := in.(map[string]any)
		require.True(t, ok, "%s: not an object", p)
		in, ok = m[p]
		require.True(t, ok, "no %s", p)
	}
	return in
}

func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("%s: no port named %q", c.Name, name)
	return 0
}

func hasPDB(t *testing.T, objs []object, d appsv1.Deployment) bool {
	t.Helper()
	for _, o := range objs {
		if o.kind() != "policy/v1/PodDisruptionBudget" {
			continue
		}
		var pdb policyv1.PodDisruptionBudget
		decode(t, o, &pdb)
		if pdb.Spec.Selector != nil && matches(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			return true
		}
	}
	return false
}

var update = flag.Bool("update", false, "rewrite deploy/k8s/base/prometheusrule.yaml from deploy/prometheus/alerts.yml")

// prometheusRule is deploy/k8s/base/prometheusrule.yaml as it must read:
// alerts.yml's text, comments included, as the PrometheusRule's spec.
func prometheusRule(t *testing.T) []byte {
	t.Helper()
	alerts, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	var b strings.Builder
	b.WriteString(`# Generated from deploy/prometheus/alerts.yml, the one source of the alert
# rules, by: go test ./internal/deploy -run TestPrometheusRuleIsAlertsYML -update
# Edit alerts.yml and run that; the test fails while the two differ.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: checkout
  # The label kube-prometheus-stack's Prometheus selects rules by
  # (docs/kubernetes.md, "Monitoring").
  labels:
    release: kube-prometheus-stack
spec:
`)
	for _, line := range strings.SplitAfter(string(alerts), "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return []byte(b.String())
}

// TestPrometheusRuleIsAlertsYML: the PrometheusRule the overlays install
// holds exactly the rules of deploy/prometheus/alerts.yml (which
// deploy/prometheus's test loads in Prometheus), generated from it.
func TestPrometheusRuleIsAlertsYML(t *testing.T) {
	file := filepath.Join(root, "deploy", "k8s", "base", "prometheusrule.yaml")
	want := prometheusRule(t)
	if *update {
		require.NoError(t, os.WriteFile(file, want, 0o644))
	}
	got, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "run: go test ./internal/deploy -run TestPrometheusRuleIsAlertsYML -update")

	alerts, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yml"))
	require.NoError(t, err)
	var rules any
	require.NoError(t, yaml.Unmarshal(alerts, &rules))
	for _, overlay := range overlays {
		var found []object
		for _, o := range render(t, overlay) {
			if o.kind() == "monitoring.coreos.com/v1/PrometheusRule" {
				found = append(found, o)
			}
		}
		require.Len(t, found, 1, overlay)
		require.Equal(t, rules, field(t, found, "spec"), "%s: the rules of alerts.yml", overlay)
	}
}

// mutations break one field of one object of each kind the overlays render;
// each must fail validation, so that a kind checked by nothing cannot slip in.
var mutations = map[string]func(o object){
	"apps/v1/Deployment": func(o object) { // a misspelt field
		set(o, []string{"spec", "replica"}, 3)
	},
	"v1/Service": func(o object) {
		set(o, []string{"spec", "ports"}, []any{map[string]any{"name": "http", "port": 80, "targetPort": "http", "protocl": "TCP"}})
	},
	"v1/ConfigMap": func(o object) { // data holds strings only
		set(o, []string{"data", "REDIS_CLUSTER"}, true)
	},
	"v1/Secret": func(o object) { // not base64
		set(o, []string{"data", "STRIPE_SECRET_KEY"}, "sk_test_123!")
	},
	"policy/v1/PodDisruptionBudget": func(o object) {
		set(o, []string{"spec", "maxUnavailble"}, 1)
	},
	"postgresql.cnpg.io/v1/Cluster": func(o object) { // not one of any, first
		set(o, []string{"spec", "postgresql", "synchronous", "method"}, "all")
	},
	"postgresql.cnpg.io/v1/Pooler": func(o object) { // not one of session, transaction
		set(o, []string{"spec", "pgbouncer", "poolMode"}, "statement")
	},
	"rabbitmq.com/v1beta1/RabbitmqCluster": func(o object) { // an unknown field
		set(o, []string{"spec", "replica"}, 3)
	},
	"redis.redis.opstreelabs.in/v1beta2/RedisCluster": func(o object) { // a required field gone
		delete(o["spec"].(map[string]any), "clusterSize")
	},
	"v1/Namespace": func(o object) { // labels hold strings only
		set(o, []string{"metadata", "labels", "pod-security.kubernetes.io/enforce"}, 1)
	},
	"v1/ServiceAccount": func(o object) { // a misspelt field
		set(o, []string{"automountServiceAccountTokens"}, false)
	},
	"networking.k8s.io/v1/NetworkPolicy": func(o object) {
		set(o, []string{"spec", "policyType"}, []any{"Ingress"})
	},
	"networking.k8s.io/v1/Ingress": func(o object) { // a string where a list goes
		set(o, []string{"spec", "rules"}, "/v1/")
	},
	"autoscaling/v2/HorizontalPodAutoscaler": func(o object) { // a string where an integer goes
		set(o, []string{"spec", "maxReplicas"}, "ten")
	},
	"postgresql.cnpg.io/v1/ScheduledBackup": func(o object) { // not one of the methods
		set(o, []string{"spec", "method"}, "pg_dump")
	},
	"barmancloud.cnpg.io/v1/ObjectStore": func(o object) { // a required field gone
		delete(o["spec"].(map[string]any)["configuration"].(map[string]any), "destinationPath")
	},
	"monitoring.coreos.com/v1/ServiceMonitor": func(o object) { // a string where a list goes
		set(o, []string{"spec", "endpoints"}, "metrics")
	},
	"monitoring.coreos.com/v1/PrometheusRule": func(o object) { // a rule without its expression
		groups := o["spec"].(map[string]any)["groups"].([]any)
		rule := groups[0].(map[string]any)["rules"].([]any)[0].(map[string]any)
		delete(rule, "expr")
	},
}

func set(o object, path []string, v any) {
	m := map[string]any(o)
	for _, p := range path[:len(path)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[path[len(path)-1]] = v
}

func deepCopy(t *testing.T, o object) object {
	t.Helper()
	b, err := json.Marshal(o)
	require.NoError(t, err)
	var c object
	require.NoError(t, json.Unmarshal(b, &c))
	return c
}

// TestValidationCatchesABrokenField: each kind's mutation makes an
// otherwise valid rendered object fail, and every kind the overlays render
// has one.
func TestValidationCatchesABrokenField(t *testing.T) {
	t.Parallel()
	v := newValidator(t)
	seen := map[string]object{}
	for _, overlay := range overlays {
		for _, o := range render(t, overlay) {
			if _, ok := seen[o.kind()]; !ok {
				seen[o.kind()] = o
			}
		}
	}
	for kind := range seen {
		require.Contains(t, mutations, kind, "a mutation for every kind rendered")
	}
	for kind, mutate := range mutations {
		t.Run(kind, func(t *testing.T) {
			o, ok := seen[kind]
			require.True(t, ok, "a kind the overlays render")
			require.NoError(t, v.validate(o))
			broken := deepCopy(t, o)
			mutate(broken)
			require.Error(t, v.validate(broken))
		})
	}
}
