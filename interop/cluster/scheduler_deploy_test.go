package cluster

// deploy/scheduler's RBAC is exactly enough (issue 39): devicelet scheduler runs under the
// ServiceAccount that deploy/scheduler/rbac.yaml binds, with nothing else, through a token from
// the TokenRequest API, with leader election on the Lease its Role allows. Its caches must sync
// (every watch listed), it must bind a pod with a claim (claim and binding writes, events), a
// gang (PodGroupScheduled), a pod asking for a DRA-backed extended resource (the special claim)
// and preempt (condition patch, delete, nomination), and its secure port must review tokens and
// access; a forbidden answer anywhere (logged at debug level) fails the test.
// scheduler_rbac_ablation_test.go runs the same workload with each rule left out.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// deployObjects decodes the YAML documents of deploy/scheduler/FILE.
func deployObjects(t *testing.T, file string) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "scheduler", file))
	if err != nil {
		t.Fatal(err)
	}
	var out []runtime.Object
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, obj)
	}
	return out
}

// applyDeployRBAC creates the namespace, ServiceAccount, roles and bindings of deploy/scheduler.
func applyDeployRBAC(t *testing.T) {
	t.Helper()
	c := controlPlane.admin
	bg := context.Background()
	for _, obj := range append(deployObjects(t, "namespace.yaml"), deployObjects(t, "rbac.yaml")...) {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = c.CoreV1().Namespaces().Create(ctx(t), o, metav1.CreateOptions{})
			// Gone before the next test applies the same files again.
			t.Cleanup(func() {
				_ = c.CoreV1().Namespaces().Delete(bg, o.Name, metav1.DeleteOptions{})
				waitFor(t, 60*time.Second, "namespace "+o.Name+" deleted", func() (bool, string) {
					_, err := c.CoreV1().Namespaces().Get(bg, o.Name, metav1.GetOptions{})
					return apierrors.IsNotFound(err), fmt.Sprint(err)
				})
			})
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx(t), o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx(t), o, metav1.CreateOptions{})
			t.Cleanup(func() { _ = c.RbacV1().ClusterRoles().Delete(bg, o.Name, metav1.DeleteOptions{}) })
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx(t), o, metav1.CreateOptions{})
			t.Cleanup(func() { _ = c.RbacV1().ClusterRoleBindings().Delete(bg, o.Name, metav1.DeleteOptions{}) })
		case *rbacv1.Role:
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx(t), o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx(t), o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected object %T in deploy/scheduler", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// serviceAccountKubeconfig writes a kubeconfig for the control plane that authenticates with a
// token of ServiceAccount ns/name only.
func serviceAccountKubeconfig(t *testing.T, ns, name string) string {
	t.Helper()
	tr, err := controlPlane.admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx(t), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	config, err := clientcmd.LoadFromFile(filepath.Join(controlPlane.state, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range config.AuthInfos {
		auth.ClientCertificate, auth.ClientKey = "", ""
		auth.ClientCertificateData, auth.ClientKeyData = nil, nil
		auth.Token = tr.Status.Token
	}
	path := filepath.Join(t.TempDir(), "sa.kubeconfig")
	if err := clientcmd.WriteToFile(*config, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// schedulerLogEnv makes the scheduler log at debug level: a refused best-effort write (an event,
// a condition, PodGroupScheduled) is only logged there, with the API server's "forbidden".
const schedulerLogEnv = "RUST_LOG=info,devicelet_scheduler=debug"

// startSchedulerProcess runs `devicelet scheduler --kubeconfig KUBECONFIG` with a plain-HTTP
// metrics address (returned) and `extra`, logging at debug level; it does not wait for it.
func startSchedulerProcess(t *testing.T, name, kubeconfig string, extra ...string) (*process, string) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startProgramEnv(t, name, os.Getenv("DEVICELET_BIN"), []string{schedulerLogEnv, "NO_COLOR=1"},
		append([]string{"scheduler", "--kubeconfig", kubeconfig, "--metrics-address", addr}, extra...)...)
	return p, addr
}

// pollUntil is waitFor returning an error instead of failing the test.
func pollUntil(timeout time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s within %s (last: %s)", what, timeout, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// schedulerReady waits for /healthz, then /readyz (every cache synced) of the scheduler's
// metrics address.
func schedulerReady(p *process, addr string, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for _, path := range []string{"/healthz", "/readyz"} {
		err := pollUntil(timeout, path+" 200", func() (bool, string) {
			select {
			case <-p.exited:
				return false, "the scheduler exited"
			default:
			}
			resp, err := client.Get("http://" + addr + path)
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == 200, resp.Status
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// forbiddenLines are the lines of a scheduler's output that report a refusal.
func forbiddenLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(strings.ToLower(l), "forbidden") {
			lines = append(lines, l)
		}
	}
	return lines
}

// deployWorkload is what the scheduler must do with deploy/scheduler's role: bind a pod with a
// template claim, a gang (PodGroup with minCount 2: members bound, PodGroupScheduled written),
// a pod asking for an extended resource backed by DRA (the special claim it creates), preempt
// (DisruptionTarget, delete, nomination), hold its Lease, and write events. Nodes are API
// objects; the cluster-scoped objects are named after `prefix`, so that workloads of
// schedulers with different names can run side by side.
type deployWorkload struct {
	ns, scheduler, prefix string
	leaseNS, leaseName    string
	extResource           string
}

// newDeployWorkload creates the nodes, slices, DeviceClasses, templates, PriorityClasses and the
// PodGroup of the workload (before the scheduler starts).
func newDeployWorkload(t *testing.T, ns, scheduler, prefix, leaseNS, leaseName string) *deployWorkload {
	t.Helper()
	w := &deployWorkload{ns: ns, scheduler: scheduler, prefix: prefix, leaseNS: leaseNS, leaseName: leaseName,
		extResource: "example.com/" + prefix + "-gpu"}
	// One device for the preemption; three for the gang of two and the extended resource.
	apiNodeFor(t, prefix+"-p", 1, prefix+"-p.example.com")
	apiNodeFor(t, prefix+"-g", 3, prefix+"-g.example.com")
	driverClass(t, prefix+"-gpu", prefix+"-p.example.com")
	driverClass(t, prefix+"-gang-gpu", prefix+"-g.example.com")
	createTemplate(t, ns, "gpu", claimSpec(prefix+"-gpu"))
	createTemplate(t, ns, "gang-gpu", claimSpec(prefix+"-gang-gpu"))
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: prefix + "-ext"},
		Spec: resourcev1.DeviceClassSpec{
			Selectors:            []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + prefix + `-g.example.com"`}}},
			ExtendedResourceName: ptr.To(w.extResource),
		},
	}
	if _, err := controlPlane.admin.ResourceV1().DeviceClasses().Create(ctx(t), class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.ResourceV1().DeviceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	priorityClass(t, prefix+"-low", 10, nil)
	priorityClass(t, prefix+"-high", 1000, nil)
	createPodGroup(t, ns, "gang", 2, "")
	return w
}

// config writes the scheduler's configuration: one profile named w.scheduler, leader election
// on w.leaseNS/w.leaseName with short timings.
func (w *deployWorkload) config(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "scheduler.yaml")
	text := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceNamespace: ` + w.leaseNS + `
  resourceName: ` + w.leaseName + `
  leaseDuration: 4s
  renewDeadline: 3s
  retryPeriod: 1s
profiles:
- schedulerName: ` + w.scheduler + "\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func (w *deployWorkload) pod(t *testing.T, name, template string, mutate func(*corev1.PodSpec)) {
	t.Helper()
	schedPod(t, w.ns, name, template, "", func(s *corev1.PodSpec) {
		s.SchedulerName = w.scheduler
		if mutate != nil {
			mutate(s)
		}
	})
}

func (w *deployWorkload) get(t *testing.T, name string) (*corev1.Pod, error) {
	return controlPlane.admin.CoreV1().Pods(w.ns).Get(ctx(t), name, metav1.GetOptions{})
}

func (w *deployWorkload) bound(t *testing.T, names ...string) func() (bool, string) {
	return func() (bool, string) {
		var pending []string
		for _, name := range names {
			p, err := w.get(t, name)
			if err != nil {
				return false, err.Error()
			}
			if p.Spec.NodeName == "" {
				pending = append(pending, name)
			}
		}
		return len(pending) == 0, "pending: " + strings.Join(pending, ", ")
	}
}

// run creates the pods step by step and returns the first step not done within `step`.
func (w *deployWorkload) run(t *testing.T, step time.Duration) error {
	t.Helper()
	priority := func(class string) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) { s.PriorityClassName = w.prefix + "-" + class }
	}
	w.pod(t, "low", "gpu", priority("low"))
	if err := pollUntil(step, "low (template claim) bound", w.bound(t, "low")); err != nil {
		return err
	}
	for i := 0; i < 2; i++ {
		w.pod(t, fmt.Sprintf("gang-%d", i), "gang-gpu", func(s *corev1.PodSpec) {
			s.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("gang")}
		})
	}
	if err := pollUntil(step, "gang of 2 bound", w.bound(t, "gang-0", "gang-1")); err != nil {
		return err
	}
	if err := pollUntil(step, "PodGroupScheduled True on the gang", func() (bool, string) {
		c := podGroupCondition(t, w.ns, "gang")
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == "Scheduled", fmt.Sprintf("%+v", c)
	}); err != nil {
		return err
	}
	w.pod(t, "ext", "", func(s *corev1.PodSpec) {
		q := *resource.NewQuantity(1, resource.DecimalSI)
		s.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceName(w.extResource): q}
		s.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(w.extResource): q}
	})
	if err := pollUntil(step, "ext (DRA-backed extended resource) bound with its allocated special claim", func() (bool, string) {
		p, err := w.get(t, "ext")
		if err != nil {
			return false, err.Error()
		}
		status := p.Status.ExtendedResourceClaimStatus
		if p.Spec.NodeName == "" || status == nil || status.ResourceClaimName == "" {
			return false, fmt.Sprintf("node %q, extendedResourceClaimStatus %+v", p.Spec.NodeName, status)
		}
		claim, err := controlPlane.admin.ResourceV1().ResourceClaims(w.ns).Get(ctx(t), status.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return claim.Status.Allocation != nil && len(claim.Status.ReservedFor) == 1, fmt.Sprintf("claim %s: %+v", claim.Name, claim.Status)
	}); err != nil {
		return err
	}
	// An API-only node has no kubelet: the victim stays terminating, the preemptor nominated.
	w.pod(t, "high", "gpu", priority("high"))
	if err := pollUntil(step, "low preempted and high nominated", func() (bool, string) {
		low, err := w.get(t, "low")
		if err != nil {
			return false, err.Error()
		}
		high, err := w.get(t, "high")
		if err != nil {
			return false, err.Error()
		}
		return low.DeletionTimestamp != nil && high.Status.NominatedNodeName == w.prefix+"-p",
			fmt.Sprintf("low deleting: %v, high nominated to %q", low.DeletionTimestamp != nil, high.Status.NominatedNodeName)
	}); err != nil {
		return err
	}
	if err := pollUntil(step, "Lease "+w.leaseNS+"/"+w.leaseName+" held", func() (bool, string) {
		lease, err := controlPlane.admin.CoordinationV1().Leases(w.leaseNS).Get(ctx(t), w.leaseName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "", "no holder"
	}); err != nil {
		return err
	}
	// Events are best effort (a refused one is only logged at debug level): look for them.
	return pollUntil(step, "Scheduled and Preempted events on low", func() (bool, string) {
		events, err := controlPlane.admin.CoreV1().Events(w.ns).List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		seen := map[string]bool{}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "low" {
				seen[e.Reason] = true
			}
		}
		return seen["Scheduled"] && seen["Preempted"], fmt.Sprint(seen)
	})
}

func TestSchedulerRunsWithTheDeployRBACOnly(t *testing.T) {
	applyDeployRBAC(t)
	ns := namespace(t, "sched-deploy")
	w := newDeployWorkload(t, ns, schedulerName, "deploy", "devicelet-system", "devicelet-scheduler")
	// /readyz needs every watch listed: a missing list or watch verb stops here.
	secure := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	proc, addr := startSchedulerProcess(t, "devicelet scheduler", serviceAccountKubeconfig(t, "devicelet-system", "devicelet-scheduler"),
		"--config", w.config(t), "--secure-address", secure)
	if err := schedulerReady(proc, addr, 30*time.Second); err != nil {
		t.Fatalf("the scheduler under deploy/scheduler's RBAC: %v", err)
	}
	checkSecurePort(t, secure)
	if err := w.run(t, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if lines := forbiddenLines(proc.output.String()); len(lines) > 0 {
		t.Errorf("the scheduler was refused something under deploy/scheduler's RBAC:\n%s", strings.Join(lines, "\n"))
	}
}

// kustomizeBuild builds deploy/DIR as `kubectl apply -k` would and decodes the objects.
func kustomizeBuild(t *testing.T, dir string) []runtime.Object {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join("..", "..", "deploy", dir))
	if err != nil {
		t.Fatalf("kustomize build deploy/%s: %v", dir, err)
	}
	var out []runtime.Object
	for _, r := range m.Resources() {
		data, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
		if err != nil {
			t.Fatalf("deploy/%s: %s: %v", dir, r.CurId(), err)
		}
		out = append(out, obj)
	}
	return out
}

// Both kustomizations build; the API server accepts every object (server-side dry run); the
// Deployment is what docs/scheduler.md promises; each ConfigMap holds a configuration with the
// profiles it names, and the scheduler starts with it.
func TestDeployKustomizationsBuildAndValidate(t *testing.T) {
	applyDeployRBAC(t)
	c := controlPlane.admin
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for dir, profiles := range map[string][]string{"scheduler": {"devicelet-scheduler"}, "scheduler-two-profiles": {"devicelet-scheduler", "gpu-packer"}} {
		for _, obj := range kustomizeBuild(t, dir) {
			var err error
			switch o := obj.(type) {
			case *appsv1.Deployment:
				_, err = c.AppsV1().Deployments(o.Namespace).Create(ctx(t), o, dry)
				pod := o.Spec.Template.Spec
				sc := pod.Containers[0].SecurityContext
				if *o.Spec.Replicas != 2 || pod.Containers[0].ReadinessProbe.HTTPGet.Path != "/readyz" ||
					pod.Containers[0].LivenessProbe.HTTPGet.Path != "/livez" || sc == nil ||
					pod.Containers[0].ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS ||
					!*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || pod.ServiceAccountName != "devicelet-scheduler" {
					t.Errorf("deploy/%s: Deployment is not as documented: %+v", dir, o.Spec)
				}
			case *policyv1.PodDisruptionBudget:
				_, err = c.PolicyV1().PodDisruptionBudgets(o.Namespace).Create(ctx(t), o, dry)
			case *corev1.ConfigMap:
				_, err = c.CoreV1().ConfigMaps(o.Namespace).Create(ctx(t), o, dry)
				text := o.Data["scheduler.yaml"]
				for _, p := range profiles {
					if !strings.Contains(text, "schedulerName: "+p) {
						t.Errorf("deploy/%s: configuration lacks profile %s:\n%s", dir, p, text)
					}
				}
				// The scheduler reads it: started against this control plane, it becomes ready.
				file := filepath.Join(t.TempDir(), "scheduler.yaml")
				text = strings.Replace(text, "leaderElect: true", "leaderElect: false", 1)
				if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
				startScheduler(t, "--config", file)
			case *corev1.Namespace, *corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *rbacv1.Role, *rbacv1.RoleBinding:
				// Created for real by applyDeployRBAC from the same files.
			default:
				t.Errorf("deploy/%s: unexpected %T", dir, obj)
			}
			if err != nil {
				t.Errorf("deploy/%s: the API server refuses %T: %v", dir, obj, err)
			}
		}
	}
}

// secureGet is GET https://addr/path (the self-signed certificate accepted) with token as
// bearer token; returns the status code and body.
func secureGet(t *testing.T, addr, path, token string) (int, string) {
	t.Helper()
	code, body, err := secureGetErr(addr, path, token)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

// secureGetErr is secureGet returning the error.
func secureGetErr(addr, path, token string) (int, string, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequest("GET", "https://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("GET https://%s%s: %v", addr, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// saToken is a token of ServiceAccount ns/name, made by the TokenRequest API.
func saToken(t *testing.T, ns, name string) string {
	t.Helper()
	c := controlPlane.admin
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx(t), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// checkSecurePort: the probes answer anyone; /metrics needs a token the API server accepts
// (TokenReview) for someone RBAC allows (SubjectAccessReview): 401 without, 403 for a
// ServiceAccount not bound to devicelet-scheduler-metrics-reader, 200 once bound. The
// scheduler makes the reviews under deploy/scheduler's role alone.
func checkSecurePort(t *testing.T, addr string) {
	t.Helper()
	ns := "devicelet-system"
	unbound := saToken(t, ns, "not-prometheus")
	token := saToken(t, ns, "prometheus")
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "devicelet-scheduler-metrics-reader-test"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "devicelet-scheduler-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}},
	}
	if _, err := controlPlane.admin.RbacV1().ClusterRoleBindings().Create(ctx(t), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	for _, p := range securePortProblems(addr, unbound, "system:serviceaccount:"+ns+":not-prometheus", token) {
		t.Error(p)
	}
}

// securePortProblems checks the secure port at addr: the probes answer anyone; /metrics is 401
// without a token or with a bad one, 403 naming the user for `unbound` (a token of `unboundUser`,
// allowed nothing), 200 for `reader` (a token bound to the metrics reader role; RBAC's cache may
// lag the binding by a moment), as is /debug/snapshot. Returns what was wrong.
func securePortProblems(addr, unbound, unboundUser, reader string) []string {
	var problems []string
	get := func(path, token string) (int, string) {
		code, body, err := secureGetErr(addr, path, token)
		if err != nil {
			return 0, err.Error()
		}
		return code, body
	}
	for _, path := range []string{"/livez", "/healthz", "/readyz"} {
		if code, body := get(path, ""); code != 200 {
			problems = append(problems, fmt.Sprintf("%s without a token: %d %.200s", path, code, body))
		}
	}
	if code, body := get("/metrics", ""); code != 401 {
		problems = append(problems, fmt.Sprintf("/metrics without a token: %d %.200s, want 401", code, body))
	}
	if code, body := get("/metrics", "not-a-token"); code != 401 {
		problems = append(problems, fmt.Sprintf("/metrics with a bad token: %d %.200s, want 401", code, body))
	}
	if code, body := get("/metrics", unbound); code != 403 || !strings.Contains(body, unboundUser) {
		problems = append(problems, fmt.Sprintf("/metrics for an unbound ServiceAccount: %d %.200s, want 403 naming it", code, body))
	}
	if err := pollUntil(10*time.Second, "/metrics allowed for the metrics reader", func() (bool, string) {
		code, body := get("/metrics", reader)
		return code == 200 && strings.Contains(body, "scheduler_"), fmt.Sprintf("%d %.200s", code, body)
	}); err != nil {
		problems = append(problems, err.Error())
	}
	if code, body := get("/debug/snapshot", reader); code != 200 || !strings.Contains(body, "live snapshot") {
		problems = append(problems, fmt.Sprintf("/debug/snapshot for the metrics reader: %d %.200s", code, body))
	}
	// Driver configuration unredacted is a path of its own, which the reader role does not grant.
	if code, body := get("/debug/snapshot/unredacted", reader); code != 403 {
		problems = append(problems, fmt.Sprintf("/debug/snapshot/unredacted for the metrics reader: %d %.200s, want 403", code, body))
	}
	return problems
}
