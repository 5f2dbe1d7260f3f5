package kubernetes

import (
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The kustomizations a platform team applies or starts from: each must render
// and hold every property below. testdata/with-nats-creds is the example with
// the nats-creds component added.
var kustomizations = []string{"base", "overlays/example", "testdata/with-nats-creds"}

// rendered is one kustomization's output, strictly decoded.
type rendered struct {
	dir         string
	deployments []*appsv1.Deployment
	pdbs        []*policyv1.PodDisruptionBudget
	configMaps  map[string]*corev1.ConfigMap
	services    []*corev1.Service
	secrets     []*corev1.Secret
}

// render runs kustomize on dir, as `kubectl apply -k dir` would, and decodes
// every object into the Kubernetes API's own types, refusing an unknown kind,
// an unknown or duplicated field and a value of the wrong type.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	out := &rendered{dir: dir, configMaps: map[string]*corev1.ConfigMap{}}
	for _, res := range resMap.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, res.CurId(), err)
		}
		obj, _, err := decoder.Decode(y, nil, nil)
		if err != nil {
			t.Fatalf("%s: %s does not decode strictly: %v\n%s", dir, res.CurId(), err, y)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			out.deployments = append(out.deployments, o)
		case *policyv1.PodDisruptionBudget:
			out.pdbs = append(out.pdbs, o)
		case *corev1.ConfigMap:
			out.configMaps[o.Name] = o
		case *corev1.Service:
			out.services = append(out.services, o)
		case *corev1.Secret:
			out.secrets = append(out.secrets, o)
		default:
			t.Fatalf("%s: unexpected kind %T", dir, obj)
		}
	}
	return out
}

func (r *rendered) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	for _, d := range r.deployments {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("%s: no Deployment %s", r.dir, name)
	return nil
}

func container(t *testing.T, d *appsv1.Deployment, name string) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == name {
			return c
		}
	}
	t.Fatalf("Deployment %s has no container %s", d.Name, name)
	return nil
}

// consumerFlags parses the consumer container's arguments with the flags the
// test reads, as `consumer run` would; the first argument is the command.
type consumerFlags struct {
	healthAddr, tools, dataDir string
	shutdownTimeout            time.Duration
}

func parseConsumerArgs(t *testing.T, c *corev1.Container) consumerFlags {
	t.Helper()
	if len(c.Command) != 0 {
		t.Fatalf("the consumer's command is %q: the image's entrypoint (consumer) must run", c.Command)
	}
	if len(c.Args) == 0 || c.Args[0] != "run" {
		t.Fatalf("the consumer's args %q do not start with run", c.Args)
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var f consumerFlags
	fs.StringVar(&f.healthAddr, "health-addr", "", "")
	fs.StringVar(&f.tools, "tools", "", "")
	fs.StringVar(&f.dataDir, "data-dir", "", "")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "") // the consumer's default
	fs.String("log-format", "", "")
	if err := fs.Parse(c.Args[1:]); err != nil {
		t.Fatalf("the consumer's args %q: %v", c.Args, err)
	}
	if fs.NArg() != 0 {
		t.Fatalf("the consumer's args %q leave %q", c.Args, fs.Args())
	}
	return f
}

func containerPort(t *testing.T, c *corev1.Container, port string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == port || fmt.Sprint(p.ContainerPort) == port {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port %s", c.Name, port)
	return 0
}

func TestManifestsRenderAndDecodeStrictly(t *testing.T) {
	for _, dir := range kustomizations {
		r := render(t, dir)
		if len(r.deployments) == 0 || len(r.pdbs) == 0 || len(r.services) == 0 || len(r.configMaps) < 2 {
			t.Errorf("%s rendered %d Deployments, %d PodDisruptionBudgets, %d Services, %d ConfigMaps",
				dir, len(r.deployments), len(r.pdbs), len(r.services), len(r.configMaps))
		}
	}
}

func TestConsumerProbesAskTheHealthAddress(t *testing.T) {
	for _, dir := range kustomizations {
		r := render(t, dir)
		c := container(t, r.deployment(t, "toolq-consumer"), "consumer")
		f := parseConsumerArgs(t, c)
		_, port, err := net.SplitHostPort(f.healthAddr)
		if err != nil {
			t.Fatalf("%s: --health-addr %q: %v", dir, f.healthAddr, err)
		}
		for _, p := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s: the consumer has no HTTP %s probe", dir, p.name)
				continue
			}
			if p.probe.HTTPGet.Path != p.path {
				t.Errorf("%s: %s probe asks %s, want %s", dir, p.name, p.probe.HTTPGet.Path, p.path)
			}
			if got := containerPort(t, c, p.probe.HTTPGet.Port.String()); fmt.Sprint(got) != port {
				t.Errorf("%s: %s probe asks port %d, --health-addr is %s", dir, p.name, got, f.healthAddr)
			}
		}
	}
}

// The drain after SIGTERM lets running tools finish for --shutdown-timeout,
// then hands back the jobs not started and flushes results: the grace period
// must leave time for that after the timeout, or the kubelet's SIGKILL cuts
// tools off mid-call.
func TestGracePeriodOutlastsTheDrain(t *testing.T) {
	const margin = 10 * time.Second
	for _, dir := range kustomizations {
		r := render(t, dir)
		d := r.deployment(t, "toolq-consumer")
		f := parseConsumerArgs(t, container(t, d, "consumer"))
		grace := d.Spec.Template.Spec.TerminationGracePeriodSeconds
		if grace == nil {
			t.Fatalf("%s: no terminationGracePeriodSeconds (Kubernetes's default is 30s)", dir)
		}
		if g := time.Duration(*grace) * time.Second; g < f.shutdownTimeout+margin {
			t.Errorf("%s: terminationGracePeriodSeconds %s, --shutdown-timeout %s: want at least %s more", dir, g, f.shutdownTimeout, margin)
		}
		for _, cm := range r.configMaps {
			if _, ok := cm.Data["TOOLQ_SHUTDOWN_TIMEOUT"]; ok {
				t.Errorf("%s: ConfigMap %s sets TOOLQ_SHUTDOWN_TIMEOUT: set --shutdown-timeout beside the grace period", dir, cm.Name)
			}
		}
	}
}

func TestDisruptionBudgetCoversTheConsumersOnly(t *testing.T) {
	for _, dir := range kustomizations {
		r := render(t, dir)
		if len(r.pdbs) != 1 {
			t.Fatalf("%s: %d PodDisruptionBudgets, want 1", dir, len(r.pdbs))
		}
		pdb := r.pdbs[0]
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Fatalf("%s: PodDisruptionBudget selector %v: %v", dir, pdb.Spec.Selector, err)
		}
		for _, d := range r.deployments {
			selects := sel.Matches(labels.Set(d.Spec.Template.Labels))
			if want := d.Name == "toolq-consumer"; selects != want || (want && pdb.Namespace != d.Namespace) {
				t.Errorf("%s: PodDisruptionBudget %s (namespace %q) selects Deployment %s's pods (namespace %q): %v", dir, pdb.Name, pdb.Namespace, d.Name, d.Namespace, selects)
			}
		}
		d := r.deployment(t, "toolq-consumer")
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MinAvailable != nil {
			t.Fatalf("%s: the budget should give maxUnavailable only (it follows the replica count)", dir)
		}
		if d.Spec.Replicas == nil || int(*d.Spec.Replicas) <= pdb.Spec.MaxUnavailable.IntValue() {
			t.Errorf("%s: %v replicas, maxUnavailable %s: a drain could take every consumer", dir, d.Spec.Replicas, pdb.Spec.MaxUnavailable)
		}
	}
}

// Every selector of a Deployment and a Service matches the pods it means, and
// every port a Service or probe names is a container's.
func TestSelectorsAndPortsMatch(t *testing.T) {
	for _, dir := range kustomizations {
		r := render(t, dir)
		for _, d := range r.deployments {
			sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
			if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("%s: Deployment %s's selector does not match its pods: %v", dir, d.Name, err)
			}
			for i := range d.Spec.Template.Spec.Containers {
				c := &d.Spec.Template.Spec.Containers[i]
				if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil {
					containerPort(t, c, c.ReadinessProbe.HTTPGet.Port.String())
				}
			}
		}
		for _, s := range r.services {
			var target *appsv1.Deployment
			for _, d := range r.deployments {
				if labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
					if target != nil {
						t.Errorf("%s: Service %s selects the pods of %s and %s", dir, s.Name, target.Name, d.Name)
					}
					target = d
				}
			}
			if target == nil || target.Namespace != s.Namespace {
				t.Errorf("%s: Service %s selects no Deployment's pods in its namespace", dir, s.Name)
				continue
			}
			for _, p := range s.Spec.Ports {
				containerPort(t, &target.Spec.Template.Spec.Containers[0], p.TargetPort.String())
			}
		}
	}
}

// The registry is a ConfigMap of the rendered output, mounted where --tools
// reads it; the values are ConfigMaps of the output too (kustomize renames
// them with a hash of their content, so a change rolls the consumers).
func TestRegistryConfigMapIsTheToolsFile(t *testing.T) {
	demo, err := os.ReadFile("../../demo/tools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range kustomizations {
		r := render(t, dir)
		d := r.deployment(t, "toolq-consumer")
		c := container(t, d, "consumer")
		f := parseConsumerArgs(t, c)
		var found bool
		for _, m := range c.VolumeMounts {
			file, ok := strings.CutPrefix(f.tools, strings.TrimSuffix(m.MountPath, "/")+"/")
			if !ok || strings.Contains(file, "/") {
				continue
			}
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name != m.Name || v.ConfigMap == nil {
					continue
				}
				cm, ok := r.configMaps[v.ConfigMap.Name]
				if !ok {
					t.Fatalf("%s: --tools %s is in ConfigMap %s, which is not rendered", dir, f.tools, v.ConfigMap.Name)
				}
				if !strings.HasPrefix(cm.Name, "toolq-registry-") {
					t.Errorf("%s: --tools %s is in ConfigMap %s, not toolq-registry", dir, f.tools, cm.Name)
				}
				if _, ok := cm.Data[file]; !ok {
					t.Errorf("%s: ConfigMap %s has no %s (--tools %s)", dir, cm.Name, file, f.tools)
				}
				// The examples run the demo registry; this keeps their copy current.
				if cm.Data[file] != string(demo) {
					t.Errorf("%s: the registry differs from demo/tools.yaml: copy it to base/tools.yaml", dir)
				}
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no ConfigMap volume is mounted where --tools %s reads", dir, f.tools)
		}
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef != nil && !optional(from.ConfigMapRef.Optional, false) {
				if _, ok := r.configMaps[from.ConfigMapRef.Name]; !ok {
					t.Errorf("%s: the consumer's environment comes from ConfigMap %s, which is not rendered", dir, from.ConfigMapRef.Name)
				}
			}
		}
	}
}

// optional returns the pointer's value or def.
func optional(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

// Secrets are created by the platform team (docs/deploy.md), never rendered
// from the repository: the database URL comes from a Secret, NATS's
// credentials from a Secret's file, and no value in a ConfigMap is a secret.
func TestSecretsComeFromSecrets(t *testing.T) {
	secretVars := []string{"DATABASE_URL", "NATS_PASSWORD", "NATS_TOKEN"}
	for _, dir := range kustomizations {
		r := render(t, dir)
		if len(r.secrets) != 0 {
			t.Errorf("%s renders %d Secrets: create them in the cluster instead", dir, len(r.secrets))
		}
		for _, cm := range r.configMaps {
			for k, v := range cm.Data {
				if slices.Contains(secretVars, k) || strings.Contains(v, "postgres://") || strings.Contains(v, "postgresql://") {
					t.Errorf("%s: ConfigMap %s holds %s: a secret belongs in a Secret", dir, cm.Name, k)
				}
			}
		}
		d := r.deployment(t, "toolq-consumer")
		c := container(t, d, "consumer")
		var db bool
		for _, e := range c.Env {
			if slices.Contains(secretVars, e.Name) {
				if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					t.Errorf("%s: %s is not taken from a Secret", dir, e.Name)
				}
				db = db || e.Name == "DATABASE_URL"
			}
			if e.Name == "NATS_CREDS" || e.Name == "NATS_NKEY" {
				if !fileInSecretVolume(d, c, e.Value) {
					t.Errorf("%s: %s=%s is not a file of a Secret's volume", dir, e.Name, e.Value)
				}
			}
		}
		if !db {
			t.Errorf("%s: the consumer has no DATABASE_URL from a Secret: its ledger would be SQLite in the pod", dir)
		}
		if dir == "testdata/with-nats-creds" && !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NATS_CREDS" }) {
			t.Errorf("%s: the nats-creds component sets no NATS_CREDS", dir)
		}
	}
}

func fileInSecretVolume(d *appsv1.Deployment, c *corev1.Container, path string) bool {
	for _, m := range c.VolumeMounts {
		if _, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/"); !ok {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return true
			}
		}
	}
	return false
}

// Every container asks for CPU and memory (the consumer's figures come from
// the bench: see the comment in base/deployment.yaml) and has a memory limit
// above its request; the consumer's heap is kept under that limit.
func TestEveryContainerRequestsResources(t *testing.T) {
	for _, dir := range kustomizations {
		r := render(t, dir)
		for _, d := range r.deployments {
			for _, c := range d.Spec.Template.Spec.Containers {
				req, lim := c.Resources.Requests, c.Resources.Limits
				cpu, mem, memLim := req[corev1.ResourceCPU], req[corev1.ResourceMemory], lim[corev1.ResourceMemory]
				if cpu.IsZero() || mem.IsZero() || memLim.Cmp(mem) < 0 {
					t.Errorf("%s: %s/%s requests cpu %s memory %s, limit memory %s", dir, d.Name, c.Name, cpu.String(), mem.String(), memLim.String())
				}
			}
		}
		c := container(t, r.deployment(t, "toolq-consumer"), "consumer")
		// The bench's peak RSS of one consumer process is near 50 MiB.
		if mem := c.Resources.Requests[corev1.ResourceMemory]; mem.Cmp(resource.MustParse("50Mi")) < 0 {
			t.Errorf("%s: the consumer requests %s of memory, below its measured peak of 50Mi", dir, mem.String())
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory"
		}) {
			t.Errorf("%s: the consumer's GOMEMLIMIT does not follow its memory limit", dir)
		}
	}
}

// The container runs as the image's nonroot user with a read-only root: the
// only directory it writes (--data-dir) is a volume.
func TestConsumerRunsUnprivileged(t *testing.T) {
	for _, dir := range kustomizations {
		r := render(t, dir)
		d := r.deployment(t, "toolq-consumer")
		c := container(t, d, "consumer")
		ps, cs := d.Spec.Template.Spec.SecurityContext, c.SecurityContext
		if ps == nil || !optional(ps.RunAsNonRoot, false) || cs == nil || !optional(cs.ReadOnlyRootFilesystem, false) || optional(cs.AllowPrivilegeEscalation, true) {
			t.Errorf("%s: the consumer may run as root, write its root or escalate: %+v %+v", dir, ps, cs)
		}
		f := parseConsumerArgs(t, c)
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == f.dataDir && !m.ReadOnly }) {
			t.Errorf("%s: --data-dir %q is not a writable volume", dir, f.dataDir)
		}
	}
}

// The consumer's flags in the manifests, and the variables the values and
// the manifests set, are the consumer's own: each is in the flags table of
// docs/configuration.md (generated from `consumer run --help`), so that a
// renamed flag or variable fails here, not in the cluster.
func TestFlagsAndVariablesAreTheConsumers(t *testing.T) {
	ref, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	table := string(ref)
	for _, dir := range kustomizations {
		r := render(t, dir)
		c := container(t, r.deployment(t, "toolq-consumer"), "consumer")
		for _, a := range c.Args[1:] {
			name, _, _ := strings.Cut(a, "=")
			if !strings.Contains(table, "| `"+name+"` |") {
				t.Errorf("%s: the consumer's argument %s is no flag of docs/configuration.md", dir, a)
			}
		}
		vars := []string{}
		for _, e := range c.Env {
			vars = append(vars, e.Name)
		}
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef != nil {
				for k := range r.configMaps[from.ConfigMapRef.Name].Data {
					vars = append(vars, k)
				}
			}
		}
		for _, v := range vars {
			if v == "GOMEMLIMIT" || v == "TOOLQ_SANDBOX_URL" { // the Go runtime's; the demo registry's
				continue
			}
			if !strings.Contains(table, "| `"+v+"` |") {
				t.Errorf("%s: the consumer's variable %s is in no row of docs/configuration.md", dir, v)
			}
		}
	}
}
