package cluster

// deploy/scheduler's RBAC is exactly enough (issue 39): devicelet scheduler runs under the
// ServiceAccount that deploy/scheduler/rbac.yaml binds, with nothing else, through a token from
// the TokenRequest API, with leader election on the Lease its Role allows. Its caches must sync
// (every watch listed), it must bind a pod with a claim (claim and binding writes, events) and
// preempt (condition patch, delete, nomination); a forbidden answer anywhere fails the test.

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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

func TestSchedulerRunsWithTheDeployRBACOnly(t *testing.T) {
	applyDeployRBAC(t)
	ns := namespace(t, "sched-deploy")
	apiNodeFor(t, "deploy-0", 1, "deploy.example.com")
	driverClass(t, "deploy-gpu", "deploy.example.com")
	createTemplate(t, ns, "gpu", claimSpec("deploy-gpu"))
	priorityClass(t, "deploy-low", 10, nil)
	priorityClass(t, "deploy-high", 1000, nil)
	config := filepath.Join(t.TempDir(), "scheduler.yaml")
	text := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceNamespace: devicelet-system
  resourceName: devicelet-scheduler
  leaseDuration: 4s
  renewDeadline: 3s
  retryPeriod: 1s
profiles:
- schedulerName: ` + schedulerName + "\n"
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// /readyz needs every watch listed: a missing list or watch verb stops here.
	secure := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	proc, _ := startSchedulerWith(t, serviceAccountKubeconfig(t, "devicelet-system", "devicelet-scheduler"),
		"--config", config, "--secure-address", secure)
	checkSecurePort(t, secure)
	priority := func(class string) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) { s.PriorityClassName = class }
	}
	schedPod(t, ns, "low", "gpu", "", priority("deploy-low"))
	waitForBound(t, ns, "low", 60*time.Second)
	schedPod(t, ns, "high", "gpu", "", priority("deploy-high"))
	// An API-only node has no kubelet: the victim stays terminating, the preemptor nominated.
	waitFor(t, 60*time.Second, "low preempted and high nominated", func() (bool, string) {
		low, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "low", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		high, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "high", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return low.DeletionTimestamp != nil && high.Status.NominatedNodeName == "deploy-0",
			fmt.Sprintf("low deleting: %v, high nominated to %q", low.DeletionTimestamp != nil, high.Status.NominatedNodeName)
	})
	lease, err := controlPlane.admin.CoordinationV1().Leases("devicelet-system").Get(ctx(t), "devicelet-scheduler", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Errorf("no Lease held in devicelet-system: %v %v", lease, err)
	}
	// Events are best effort (a refused one is only logged at debug level): look for them.
	waitFor(t, 30*time.Second, "Scheduled and Preempted events on low", func() (bool, string) {
		events, err := controlPlane.admin.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{})
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
	out := proc.output.String()
	if strings.Contains(strings.ToLower(out), "forbidden") {
		t.Errorf("the scheduler was refused something under deploy/scheduler's RBAC:\n%s", grepLines(strings.ToLower(out), "forbidden"))
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
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequest("GET", "https://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET https://%s%s: %v", addr, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
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
	for _, path := range []string{"/livez", "/healthz", "/readyz"} {
		if code, body := secureGet(t, addr, path, ""); code != 200 {
			t.Errorf("%s without a token: %d %s", path, code, body)
		}
	}
	if code, body := secureGet(t, addr, "/metrics", ""); code != 401 {
		t.Errorf("/metrics without a token: %d %s, want 401", code, body)
	}
	if code, _ := secureGet(t, addr, "/metrics", "not-a-token"); code != 401 {
		t.Errorf("/metrics with a bad token: %d, want 401", code)
	}
	ns := "devicelet-system"
	if code, body := secureGet(t, addr, "/metrics", saToken(t, ns, "not-prometheus")); code != 403 || !strings.Contains(body, "system:serviceaccount:devicelet-system:not-prometheus") {
		t.Errorf("/metrics for an unbound ServiceAccount: %d %s, want 403 naming it", code, body)
	}
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
	// RBAC's cache may lag the binding by a moment.
	waitFor(t, 10*time.Second, "/metrics allowed once bound", func() (bool, string) {
		code, body := secureGet(t, addr, "/metrics", token)
		return code == 200 && strings.Contains(body, "scheduler_"), fmt.Sprint(code)
	})
	if code, body := secureGet(t, addr, "/debug/snapshot", token); code != 200 || !strings.Contains(body, "live snapshot") {
		t.Errorf("/debug/snapshot for the metrics reader: %d %.200s", code, body)
	}
}
