// Package k8sapply proves deploy/k8s on a real Kubernetes API server:
// kube-apiserver and etcd, built from k8s.io/kubernetes at the release
// go.mod pins (make test-k8s builds them into K8S_BIN_DIR), started by the
// test, with the operators' CRDs installed; each overlay is applied
// server-side twice, a first install and an upgrade to a new image tag.
//
// A module of its own so that k8s.io/kubernetes and its staging modules
// stay out of the service's go.mod.
package k8sapply

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// binDir holds kube-apiserver and etcd (the etcd server's main package
// builds as "server"): K8S_BIN_DIR, which make test-k8s sets.
func binDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("K8S_BIN_DIR")
	require.NotEmpty(t, dir, "K8S_BIN_DIR: run make test-k8s, which builds kube-apiserver and etcd there")
	for _, b := range []string{"kube-apiserver", "server"} {
		_, err := os.Stat(filepath.Join(dir, b))
		require.NoError(t, err, "run make test-k8s, which builds %s into K8S_BIN_DIR", b)
	}
	return dir
}

// freePort returns a TCP port nothing listens on at the time of the call.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// syncBuffer is a process's output, kept for the test's log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs a server until the test ends; its output goes to the test's
// log when the test fails.
func start(t *testing.T, name string, args ...string) {
	t.Helper()
	var out syncBuffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(name), tail(out.String(), 4000))
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// waitFor polls ready until it returns nil, for at most limit.
func waitFor(t *testing.T, what string, limit time.Duration, ready func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not ready after %s: %v", what, limit, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// warnings collects the API server's warnings (Pod Security's among them).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

// apiServer starts etcd and kube-apiserver and returns a client config for
// system:masters, and the warning collector its clients report to.
func apiServer(t *testing.T) (*rest.Config, *warnings) {
	t.Helper()
	bin := binDir(t)
	dir := t.TempDir()

	client, peer := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	start(t, filepath.Join(bin, "server"),
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		// A test's data: no fsync, as Kubernetes' own integration tests.
		"--unsafe-no-fsync")
	waitFor(t, "etcd", time.Minute, func() error {
		resp, err := http.Get(etcdURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})

	// The service-account signing key the API server requires, and a
	// static token for system:masters.
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	keyFile := filepath.Join(dir, "sa.key")
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600))
	token := rand.Text()
	tokenFile := filepath.Join(dir, "tokens.csv")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+",admin,admin,system:masters\n"), 0o600))

	port := freePort(t)
	start(t, filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(port),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", tokenFile,
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", keyFile,
		"--service-account-signing-key-file", keyFile,
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--allow-privileged=false")
	w := &warnings{}
	cfg := &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", port),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		WarningHandler:  w,
		QPS:             200, Burst: 400,
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	waitFor(t, "kube-apiserver", 3*time.Minute, func() error {
		req, _ := http.NewRequest(http.MethodGet, cfg.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
	return cfg, w
}

// crdFiles are the operators' CRDs the overlays' custom resources need,
// copied with their provenance into internal/deploy/testdata/crds (its
// README; the same files as ../shared/k8s-crds, plus ScheduledBackup and
// the Barman Cloud plugin's ObjectStore).
var crdFiles = []string{
	"cnpg-clusters.yaml", "cnpg-poolers.yaml", "cnpg-scheduledbackups.yaml",
	"plugin-barman-cloud-objectstores.yaml", "rabbitmq-rabbitmqclusters.yaml",
	"redis-operator-redisclusters.yaml",
	"prometheus-operator-servicemonitors.yaml", "prometheus-operator-prometheusrules.yaml",
}

// installCRDs creates the CRDs and waits until each is established.
func installCRDs(t *testing.T, ctx context.Context, cfg *rest.Config) {
	t.Helper()
	cs, err := apiextensionsclient.NewForConfig(cfg)
	require.NoError(t, err)
	for _, f := range crdFiles {
		b, err := os.ReadFile(filepath.Join(root, "internal", "deploy", "testdata", "crds", f))
		require.NoError(t, err)
		var crd apiextensionsv1.CustomResourceDefinition
		require.NoError(t, yaml.UnmarshalStrict(b, &crd), f)
		_, err = cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{})
		require.NoError(t, err, f)
		waitFor(t, crd.Name, time.Minute, func() error {
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
			}
			return errors.New("not established")
		})
	}
}

// render builds an overlay as `kubectl apply -k` would; a non-empty tag
// first sets the checkout image's tag as `kustomize edit set image` in the
// overlay would (the upgrade of the runbook).
func render(t *testing.T, overlay, tag string) []*unstructured.Unstructured {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join(root, "deploy", "k8s", "overlays", overlay))
	require.NoError(t, err)
	opts := krusty.MakeDefaultOptions()
	if tag != "" {
		upgrade := t.TempDir()
		rel, err := filepath.Rel(upgrade, dir) // kustomize takes no absolute path
		require.NoError(t, err)
		k := kustypes.Kustomization{
			Resources: []string{rel},
			Images:    []kustypes.Image{{Name: "onceonly/checkout", NewTag: tag}},
		}
		b, err := yaml.Marshal(k)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(upgrade, "kustomization.yaml"), b, 0o644))
		dir = upgrade
		opts.LoadRestrictions = kustypes.LoadRestrictionsNone
	}
	resMap, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err, "kustomize build %s", overlay)
	var out []*unstructured.Unstructured
	for _, r := range resMap.Resources() {
		b, err := r.MarshalJSON()
		require.NoError(t, err)
		u := &unstructured.Unstructured{}
		require.NoError(t, u.UnmarshalJSON(b))
		out = append(out, u)
	}
	// The namespace before what it holds.
	slices.SortStableFunc(out, func(a, b *unstructured.Unstructured) int {
		return boolInt(b.GetKind() == "Namespace") - boolInt(a.GetKind() == "Namespace")
	})
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cluster is a client of the test's API server.
type cluster struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	warn   *warnings
}

func newCluster(t *testing.T, cfg *rest.Config, w *warnings) *cluster {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	require.NoError(t, err)
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	return &cluster{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), warn: w}
}

func (c *cluster) resource(t *testing.T, o *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	require.NoError(t, err, "%s: a kind the server serves", gvk)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	return c.dyn.Resource(m.Resource)
}

// apply server-side applies o with strict field validation, as
// `kubectl apply --server-side` does, and returns what the server stored.
func (c *cluster) apply(t *testing.T, ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	t.Helper()
	b, err := json.Marshal(o.Object)
	require.NoError(t, err)
	force := true
	return c.resource(t, o).Patch(ctx, o.GetName(), types.ApplyPatchType, b, metav1.PatchOptions{
		FieldManager: "checkout-deploy", Force: &force, FieldValidation: "Strict",
	})
}

func id(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// applyAll applies every object, requires each to be accepted, and returns
// the stored objects and the warnings the server gave, by object.
func (c *cluster) applyAll(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) (map[string]*unstructured.Unstructured, map[string][]string) {
	t.Helper()
	stored := map[string]*unstructured.Unstructured{}
	warned := map[string][]string{}
	c.warn.take()
	for _, o := range objs {
		got, err := c.apply(t, ctx, o)
		require.NoError(t, err, "the server accepts %s", id(o))
		stored[id(o)] = got
		if w := c.warn.take(); len(w) > 0 {
			warned[id(o)] = w
		}
	}
	return stored, warned
}

// TestOverlaysApplyOnARealAPIServer: on kube-apiserver 1.34 with the
// operators' CRDs, each overlay is accepted by server-side apply with
// strict field validation (every built-in kind against the server's own
// validation, every custom resource against its CRD's schema and CEL
// rules), first as an install and then as an upgrade to a new image tag;
// the upgrade changes the processes' images, keeps the replicas the
// autoscaler set, and Pod Security warns about none of the service's pods
// at the namespace's restricted level. The server also refuses what the
// offline validation lets through (an enum out of range, a container
// without a name, a CEL rule of CloudNativePG's CRD).
func TestOverlaysApplyOnARealAPIServer(t *testing.T) {
	cfg, w := apiServer(t)
	ctx := t.Context()
	installCRDs(t, ctx, cfg)
	c := newCluster(t, cfg, w)

	for _, overlay := range []string{"dev", "production"} {
		t.Run(overlay, func(t *testing.T) {
			install := render(t, overlay, "")
			ns := ""
			for _, o := range install {
				if o.GetKind() == "Deployment" {
					ns = o.GetNamespace()
				}
			}
			require.NotEmpty(t, ns)
			if !slices.ContainsFunc(install, func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" }) {
				// internal/deploy's TestPlatformBasics requires the
				// overlay's own; without it, the namespace as kubectl
				// create namespace makes it.
				_, err := c.apply(t, ctx, &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}})
				require.NoError(t, err)
			}
			stored, warned := c.applyAll(t, ctx, install)
			for id, w := range warned {
				t.Logf("%s: the server warns: %s", id, strings.Join(w, "; "))
			}
			for _, name := range []string{"checkout-api", "checkout-dispatcher", "checkout-worker", "stripe-emulator", "mailpit"} {
				require.Empty(t, warned["Deployment "+ns+"/"+name], "Pod Security (restricted) warns about %s", name)
			}

			// What the server defaulted: the api has no replicas in the
			// manifests, so the server sets one and the autoscaler owns the
			// count; the CRDs' defaults fill the plugin's enabled flag.
			api := stored["Deployment "+ns+"/checkout-api"]
			replicas, _, _ := unstructured.NestedInt64(api.Object, "spec", "replicas")
			require.EqualValues(t, 1, replicas, "the server's default")
			if overlay == "production" {
				db := stored["Cluster "+ns+"/checkout-db"]
				plugins, _, _ := unstructured.NestedSlice(db.Object, "spec", "plugins")
				require.Len(t, plugins, 1)
				require.Equal(t, true, plugins[0].(map[string]any)["enabled"], "the CRD's default")
			}

			// The autoscaler scales the api to 4: an upgrade must keep that.
			deploys := c.dyn.Resource(apiResource(t, c, "apps", "v1", "Deployment")).Namespace(ns)
			_, err := deploys.Patch(ctx, "checkout-api", types.MergePatchType, []byte(`{"spec":{"replicas":4}}`), metav1.PatchOptions{FieldManager: "horizontal-pod-autoscaler"}, "scale")
			require.NoError(t, err)

			// The upgrade: the same overlay with a new tag, applied over it.
			upgrade := render(t, overlay, "9.9.9")
			after, _ := c.applyAll(t, ctx, upgrade)
			for _, name := range []string{"checkout-api", "checkout-dispatcher", "checkout-worker"} {
				d := after["Deployment "+ns+"/"+name]
				for _, path := range [][]string{{"spec", "template", "spec", "initContainers"}, {"spec", "template", "spec", "containers"}} {
					cs, _, _ := unstructured.NestedSlice(d.Object, path...)
					require.NotEmpty(t, cs)
					image := cs[0].(map[string]any)["image"]
					require.Equal(t, "onceonly/checkout:9.9.9", image, "%s %s after the upgrade", name, path[len(path)-1])
				}
				require.Greater(t, d.GetGeneration(), stored["Deployment "+ns+"/"+name].GetGeneration(), "%s: a new rollout", name)
			}
			replicas, _, _ = unstructured.NestedInt64(after["Deployment "+ns+"/checkout-api"].Object, "spec", "replicas")
			require.EqualValues(t, 4, replicas, "the upgrade keeps the autoscaler's count")
		})
	}

	t.Run("Pod Security warns about a pod that is not restricted", func(t *testing.T) {
		// The check above sees warnings: a pod template without the
		// restricted profile's settings draws one in the namespace.
		d := render(t, "production", "")
		var api *unstructured.Unstructured
		for _, o := range d {
			if o.GetKind() == "Deployment" && o.GetName() == "checkout-api" {
				api = o.DeepCopy()
			}
		}
		require.NotNil(t, api)
		api.SetName("checkout-api-unrestricted")
		unstructured.RemoveNestedField(api.Object, "spec", "template", "spec", "securityContext")
		c.warn.take()
		_, err := c.apply(t, ctx, api)
		require.NoError(t, err, "warn and audit only: a Deployment is admitted")
		require.NotEmpty(t, c.warn.take(), "a Pod Security warning")
	})

	t.Run("the server refuses", func(t *testing.T) {
		objs := render(t, "production", "")
		find := func(kind, name string) *unstructured.Unstructured {
			for _, o := range objs {
				if o.GetKind() == kind && o.GetName() == name {
					return o.DeepCopy()
				}
			}
			t.Fatalf("no %s %s", kind, name)
			return nil
		}
		for _, tc := range []struct {
			what   string
			obj    *unstructured.Unstructured
			mutate func(o map[string]any)
			want   string
		}{
			{"an enum out of range", find("Deployment", "checkout-api"), func(o map[string]any) {
				tsc, _, _ := unstructured.NestedSlice(o, "spec", "template", "spec", "topologySpreadConstraints")
				tsc[0].(map[string]any)["whenUnsatisfiable"] = "Sometimes"
				_ = unstructured.SetNestedSlice(o, tsc, "spec", "template", "spec", "topologySpreadConstraints")
			}, "whenUnsatisfiable"},
			{"a container without a name", find("Deployment", "checkout-worker"), func(o map[string]any) {
				cs, _, _ := unstructured.NestedSlice(o, "spec", "template", "spec", "containers")
				delete(cs[0].(map[string]any), "name")
				_ = unstructured.SetNestedSlice(o, cs, "spec", "template", "spec", "containers")
			}, "name"},
			{"an unknown field", find("Deployment", "checkout-dispatcher"), func(o map[string]any) {
				_ = unstructured.SetNestedField(o, int64(3), "spec", "replica")
			}, ".spec.replica: field not declared in schema"},
			{"CloudNativePG's CEL rule: a synchronous number of 0", find("Cluster", "checkout-db"), func(o map[string]any) {
				_ = unstructured.SetNestedField(o, int64(0), "spec", "postgresql", "synchronous", "number")
			}, "synchronous replicas should be greater than zero"},
			{"CloudNativePG's CEL rule: preferred durability with named standbys", find("Cluster", "checkout-db"), func(o map[string]any) {
				_ = unstructured.SetNestedField(o, "preferred", "spec", "postgresql", "synchronous", "dataDurability")
				_ = unstructured.SetNestedStringSlice(o, []string{"x"}, "spec", "postgresql", "synchronous", "standbyNamesPre")
			}, "dataDurability set to 'preferred'"},
			{"the Pooler's pool mode out of its enum", find("Pooler", "checkout-db-pooler-rw"), func(o map[string]any) {
				_ = unstructured.SetNestedField(o, "statement", "spec", "pgbouncer", "poolMode")
			}, "poolMode"},
			{"a Job's template changed (what the migrate Job of issue 37 met)", migrateJob("onceonly/checkout:1.0.0"), nil, ""},
		} {
			t.Run(tc.what, func(t *testing.T) {
				o := tc.obj
				o.SetName(o.GetName() + "-refused")
				if tc.mutate == nil { // a Job: accepted once, then refused with another image
					_, err := c.apply(t, ctx, o)
					require.NoError(t, err)
					o = migrateJob("onceonly/checkout:1.0.1")
					o.SetName(tc.obj.GetName())
					_, err = c.apply(t, ctx, o)
					require.Error(t, err)
					require.True(t, apierrors.IsInvalid(err), "%v", err)
					require.Contains(t, err.Error(), "field is immutable")
					return
				}
				tc.mutate(o.Object)
				_, err := c.apply(t, ctx, o)
				require.Error(t, err)
				require.Contains(t, err.Error(), tc.want)
			})
		}
	})
}

// migrateJob is a Job like the checkout-migrate Job the overlays shipped
// before issue 37, with image.
func migrateJob(image string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "batch/v1", "kind": "Job",
		"metadata": map[string]any{"name": "checkout-migrate", "namespace": "checkout"},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"restartPolicy": "OnFailure",
			"containers":    []any{map[string]any{"name": "migrate", "image": image, "command": []any{"migrate"}}},
		}}},
	}}
}

func apiResource(t *testing.T, c *cluster, group, version, kind string) schema.GroupVersionResource {
	t.Helper()
	m, err := c.mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind}, version)
	require.NoError(t, err)
	return m.Resource
}
