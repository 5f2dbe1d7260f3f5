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
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The kustomizations a platform team applies or starts from: each must render
// and hold every property below. testdata/with-nats-creds is the example with
// the nats-creds component added, testdata/longer-drain the example with the
// drain docs/deploy.md shows.
var kustomizations = []string{"base", "overlays/example", "testdata/with-nats-creds", "testdata/longer-drain"}

// rendered is one kustomization's output, strictly decoded.
type rendered struct {
	dir         string
	deployments []*appsv1.Deployment
	sets        []*appsv1.StatefulSet
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
		case *appsv1.StatefulSet:
			out.sets = append(out.sets, o)
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
		if mem := c.Resources.Requests[corev1.ResourceMemory]; mem.Cmp(resource.MustParse("90Mi")) < 0 {
			t.Errorf("%s: the consumer requests %s of memory, below its measured peak of 90Mi", dir, mem.String())
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

// The NATS cluster of nats-cluster/ is the one of docs/scaling.md: three
// servers with JetStream, each routed to all three by the names the headless
// Service gives them, each storing on its own volume. Its configuration is
// read by nats-server's own parser, as each pod's server reads it.
func TestNATSClusterIsThreeRoutedJetStreamServers(t *testing.T) {
	r := render(t, "nats-cluster")
	if len(r.sets) != 1 || len(r.services) != 1 || len(r.pdbs) != 1 {
		t.Fatalf("rendered %d StatefulSets, %d Services, %d PodDisruptionBudgets", len(r.sets), len(r.services), len(r.pdbs))
	}
	set, svc, pdb := r.sets[0], r.services[0], r.pdbs[0]
	if set.Spec.Replicas == nil || *set.Spec.Replicas != 3 {
		t.Fatalf("replicas %v, want 3", set.Spec.Replicas)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Name != set.Spec.ServiceName || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s (clusterIP %q) is not the StatefulSet's headless service %s that names servers before they are ready", svc.Name, svc.Spec.ClusterIP, set.Spec.ServiceName)
	}
	podLabels := labels.Set(set.Spec.Template.Labels)
	pdbSel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !pdbSel.Matches(podLabels) || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("the budget or the Service does not select the servers: %v", err)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("maxUnavailable %v: a drain must keep two of three (the JetStream quorum)", pdb.Spec.MaxUnavailable)
	}
	c := &set.Spec.Template.Spec.Containers[0]
	var confPath string
	for i, a := range c.Args {
		if a == "--config" && i+1 < len(c.Args) {
			confPath = c.Args[i+1]
		}
	}
	var conf, storeMount string
	for _, m := range c.VolumeMounts {
		for _, v := range set.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				if text, ok := r.configMaps[v.ConfigMap.Name].Data[strings.TrimPrefix(confPath, m.MountPath+"/")]; ok {
					conf = text
				}
			}
		}
		for _, pvc := range set.Spec.VolumeClaimTemplates {
			if pvc.Name == m.Name {
				storeMount = m.MountPath
			}
		}
	}
	if conf == "" || storeMount == "" {
		t.Fatalf("--config %q is no file of a mounted ConfigMap, or no volume claim is mounted", confPath)
	}
	file := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 3 {
		want = append(want, fmt.Sprintf("nats://%s-%d.%s.%s.svc:%d", set.Name, i, svc.Name, set.Namespace, containerPort(t, c, "cluster")))
	}
	var grace time.Duration
	if g := set.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	for i := range 3 {
		pod := fmt.Sprintf("%s-%d", set.Name, i)
		t.Setenv("POD_NAME", pod)
		opts, err := server.ProcessConfigFile(file)
		if err != nil {
			t.Fatalf("nats-server refuses the configuration: %v", err)
		}
		var routes []string
		for _, u := range opts.Routes {
			routes = append(routes, u.String())
		}
		switch {
		case opts.ServerName != pod:
			t.Errorf("server_name %q in pod %s", opts.ServerName, pod)
		case !opts.JetStream || opts.StoreDir != storeMount:
			t.Errorf("JetStream %v storing in %q, the volume is at %s", opts.JetStream, opts.StoreDir, storeMount)
		case opts.Cluster.Name == "" || fmt.Sprint(opts.Cluster.Port) != fmt.Sprint(containerPort(t, c, "cluster")):
			t.Errorf("cluster %q on port %d", opts.Cluster.Name, opts.Cluster.Port)
		case fmt.Sprint(opts.Port) != fmt.Sprint(containerPort(t, c, "client")) || fmt.Sprint(opts.HTTPPort) != fmt.Sprint(containerPort(t, c, "monitor")):
			t.Errorf("client port %d, monitoring port %d: not the container's", opts.Port, opts.HTTPPort)
		case !slices.Equal(routes, want):
			t.Errorf("routes %q, want %q", routes, want)
		case grace <= opts.LameDuckDuration+opts.LameDuckGracePeriod:
			t.Errorf("grace period %s: the lame-duck mode takes %s", grace, opts.LameDuckDuration+opts.LameDuckGracePeriod)
		}
	}
}
