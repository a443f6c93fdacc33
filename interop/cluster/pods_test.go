package cluster

// Pods on devicelet nodes: scheduling by the real kube-scheduler on what devicelet advertises,
// admission, status, PodResources, release on scale-down, health and topology rejections.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/utils/ptr"
)

const gpu = "example.com/gpu"

// podSpec is a one-container pod asking for `gpus` devices, pinned to `nodeName` by label unless
// it is empty.
func podSpec(nodeName string, gpus int64) corev1.PodSpec {
	limits := corev1.ResourceList{}
	if gpus > 0 {
		limits[corev1.ResourceName(gpu)] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	var selector map[string]string
	if nodeName != "" {
		selector = map[string]string{"kubernetes.io/hostname": nodeName}
	}
	return corev1.PodSpec{
		NodeSelector:                  selector,
		TerminationGracePeriodSeconds: ptr.To[int64](5),
		Containers: []corev1.Container{{
			Name:      "main",
			Image:     "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: limits},
		}},
	}
}

func createDeployment(t *testing.T, ns, name, nodeName string, replicas int32, gpus int64) {
	t.Helper()
	createDeploymentWith(t, ns, name, replicas, podSpec(nodeName, gpus))
}

// createDeploymentWith creates Deployment `name` in ns whose pods, labelled app=name, have spec.
func createDeploymentWith(t *testing.T, ns, name string, replicas int32, spec corev1.PodSpec) {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
	if _, err := controlPlane.admin.AppsV1().Deployments(ns).Create(ctx(t), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment %s: %v", name, err)
	}
}

func scaleDeployment(t *testing.T, ns, name string, replicas int32) {
	t.Helper()
	s, err := controlPlane.admin.AppsV1().Deployments(ns).GetScale(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Replicas = replicas
	if _, err := controlPlane.admin.AppsV1().Deployments(ns).UpdateScale(ctx(t), name, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// namespace creates a fresh namespace for the test (deleted at the end) and waits for its
// default ServiceAccount.
func namespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := controlPlane.admin.CoreV1().Namespaces().Create(ctx(t), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	// kube-controller-manager's service-account controller makes it. Right after a kube-apiserver
	// restart its watches may still be in back-off on a loaded machine: after 30 s the test
	// makes the (empty) ServiceAccount itself, as the controller would, rather than fail on
	// something it does not test.
	deadline := time.Now().Add(30 * time.Second)
	waitFor(t, 90*time.Second, "default ServiceAccount in "+name, func() (bool, string) {
		_, err := controlPlane.admin.CoreV1().ServiceAccounts(name).Get(ctx(t), "default", metav1.GetOptions{})
		if err != nil && time.Now().After(deadline) {
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
			if _, cerr := controlPlane.admin.CoreV1().ServiceAccounts(name).Create(ctx(t), sa, metav1.CreateOptions{}); cerr == nil {
				t.Logf("namespace %s: no default ServiceAccount from kube-controller-manager after 30 s; created it", name)
			}
		}
		return err == nil, fmt.Sprint(err)
	})
	return name
}

// podPhases lists the pods of app `app` in ns as name -> phase (with "/not-ready" and
// "/deleting" marks); pods being deleted included. A failed list (a busy or restarting API
// server) is reported in the map and retried by the caller's poll.
func podPhases(t *testing.T, ns, app string) (map[string]string, []corev1.Pod) {
	t.Helper()
	list, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return map[string]string{"list error": err.Error()}, nil
	}
	phases := map[string]string{}
	for _, p := range list.Items {
		phase := string(p.Status.Phase)
		if !podReady(&p) {
			phase += "/not-ready"
		}
		if p.DeletionTimestamp != nil {
			phase += "/deleting"
		}
		phases[p.Name] = phase
	}
	return phases, list.Items
}

// waitForRunning waits until exactly `n` pods of app run (all Ready) and no other pod of the app
// exists.
func waitForRunning(t *testing.T, ns, app string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	// Hundreds of pods are listed every second, not five times a second.
	interval := 200 * time.Millisecond
	if n > 50 {
		interval = time.Second
	}
	var pods []corev1.Pod
	waitForEvery(t, timeout, interval, fmt.Sprintf("%d running pods of %s", n, app), func() (bool, string) {
		phases, items := podPhases(t, ns, app)
		running := 0
		for _, p := range items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && podReady(&p) {
				running++
			}
		}
		pods = items
		state := fmt.Sprint(phases)
		if len(state) > 2000 {
			state = fmt.Sprintf("%d of %d running (%d pods)", running, n, len(items))
		}
		return running == n && len(items) == n && phases["list error"] == "", state
	})
	return pods
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podResources lists the node's pods and their devices of `gpu` through the upstream
// PodResources v1 client (k8s.io/kubernetes/pkg/kubelet/apis/podresources), as pod name ->
// device IDs.
func podResources(t *testing.T, n *node) map[string][]string {
	t.Helper()
	socket := filepath.Join(n.root, "pod-resources", "kubelet.sock")
	client, conn, err := podresources.GetV1Client("unix://"+socket, 10*time.Second, 16*1024*1024)
	if err != nil {
		t.Fatalf("PodResources client: %v", err)
	}
	defer conn.Close()
	resp, err := client.List(ctx(t), &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("PodResources List: %v", err)
	}
	out := map[string][]string{}
	for _, p := range resp.GetPodResources() {
		var ids []string
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == gpu {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
		sort.Strings(ids)
		out[p.GetName()] = ids
	}
	return out
}

// distinctDevices fails unless every pod holds `per` devices and no device is held twice.
func distinctDevices(t *testing.T, held map[string][]string, per int) {
	t.Helper()
	owner := map[string]string{}
	for pod, ids := range held {
		if len(ids) != per {
			t.Fatalf("pod %s holds %v, want %d devices (all: %v)", pod, ids, per, held)
		}
		for _, id := range ids {
			if other, dup := owner[id]; dup {
				t.Fatalf("device %s held by both %s and %s (all: %v)", id, other, pod, held)
			}
			owner[id] = pod
		}
	}
}

// TestDeploymentScheduledAdmittedReleased: the example plugin's devices appear in the Node's
// allocatable; the real kube-scheduler places a Deployment on them; devicelet admits the pods and
// reports them Running with allocatedResourcesStatus; PodResources lists them with distinct
// devices; scaling down releases the devices (PodResources, then a new pod takes them).
func TestDeploymentScheduledAdmittedReleased(t *testing.T) {
	ns := namespace(t, "deploy")
	n := startNode(t, "node-deploy")
	n.plugin(t, "--devices", "4")
	waitForResource(t, n.name, gpu, 4, 4)
	hugepagesMatchTheHost(t, n.name)

	createDeployment(t, ns, "web", n.name, 3, 1)
	pods := waitForRunning(t, ns, "web", 3, 90*time.Second)
	for _, p := range pods {
		if len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
			t.Fatalf("pod %s container statuses: %+v", p.Name, p.Status.ContainerStatuses)
		}
		st := p.Status.ContainerStatuses[0].AllocatedResourcesStatus
		if len(st) != 1 || string(st[0].Name) != gpu || len(st[0].Resources) != 1 ||
			st[0].Resources[0].Health != corev1.ResourceHealthStatusHealthy {
			t.Fatalf("pod %s allocatedResourcesStatus = %+v, want one healthy %s device", p.Name, st, gpu)
		}
	}
	held := podResources(t, n)
	if len(held) != 3 {
		t.Fatalf("PodResources lists %v, want the 3 pods", held)
	}
	distinctDevices(t, held, 1)
	for _, p := range pods {
		if _, ok := held[p.Name]; !ok {
			t.Fatalf("PodResources does not list running pod %s: %v", p.Name, held)
		}
	}

	// Scale down: devicelet releases the devices of the pods being deleted, then deletes them
	// (the kubelet's final delete, grace period 0).
	scaleDeployment(t, ns, "web", 1)
	waitForRunning(t, ns, "web", 1, 60*time.Second)
	waitFor(t, 30*time.Second, "PodResources to list one pod", func() (bool, string) {
		held := podResources(t, n)
		return len(held) == 1, fmt.Sprint(held)
	})
	// The 3 released devices take 3 new pods (4 devices, 1 held).
	scaleDeployment(t, ns, "web", 4)
	waitForRunning(t, ns, "web", 4, 60*time.Second)
	held = podResources(t, n)
	if len(held) != 4 {
		t.Fatalf("PodResources lists %v, want 4 pods", held)
	}
	distinctDevices(t, held, 1)
	// `devicelet get pods` (the local control API) agrees with the cluster.
	out := n.cli(t, "get", "pods")
	for name := range held {
		if !strings.Contains(out, name) {
			t.Fatalf("devicelet get pods does not list %s:\n%s", name, out)
		}
	}
}

// hugepagesMatchTheHost: the Node advertises one hugepages-<size> resource per pool in
// /sys/kernel/mm/hugepages, capacity and allocatable = nr_hugepages × page size, as the kubelet's
// MachineInfo setter does.
func hugepagesMatchTheHost(t *testing.T, node string) {
	t.Helper()
	pools, err := filepath.Glob("/sys/kernel/mm/hugepages/hugepages-*kB")
	if err != nil {
		t.Fatal(err)
	}
	for _, pool := range pools {
		var kib int64
		if _, err := fmt.Sscanf(filepath.Base(pool), "hugepages-%dkB", &kib); err != nil {
			t.Fatalf("%s: %v", pool, err)
		}
		raw, err := os.ReadFile(filepath.Join(pool, "nr_hugepages"))
		if err != nil {
			continue
		}
		pages, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", pool, err)
		}
		name := "hugepages-" + resource.NewQuantity(kib*1024, resource.BinarySI).String()
		capacity, allocatable, _ := resourceOf(t, node, name)
		if capacity != pages*kib*1024 || allocatable != capacity {
			t.Fatalf("node %s %s: capacity %d allocatable %d, want %d (%d pages)", node, name, capacity, allocatable, pages*kib*1024, pages)
		}
	}
}

// TestUnhealthyDeviceLowersAllocatable: a device the plugin reports unhealthy stays in capacity
// and leaves allocatable; a pod holding it sees it Unhealthy in allocatedResourcesStatus.
func TestUnhealthyDeviceLowersAllocatable(t *testing.T) {
	ns := namespace(t, "health")
	n := startNode(t, "node-health")
	plugin := n.plugin(t, "--devices", "2")
	waitForResource(t, n.name, gpu, 2, 2)
	createDeployment(t, ns, "one", n.name, 2, 1)
	pods := waitForRunning(t, ns, "one", 2, 90*time.Second)

	// The plugin restarts reporting gpu-1 unhealthy (as a plugin does after a device fault).
	held := podResources(t, n)
	plugin.stop()
	n.plugin(t, "--devices", "2", "--unhealthy", "gpu-1")
	waitForResource(t, n.name, gpu, 2, 1)

	var holder string
	for pod, ids := range held {
		if len(ids) == 1 && ids[0] == "gpu-1" {
			holder = pod
		}
	}
	if holder == "" {
		t.Fatalf("no pod holds gpu-1: %v", held)
	}
	_ = pods
	waitFor(t, 30*time.Second, holder+" sees gpu-1 Unhealthy", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), holder, metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, fmt.Sprint(err)
		}
		st := p.Status.ContainerStatuses[0].AllocatedResourcesStatus
		ok := len(st) == 1 && len(st[0].Resources) == 1 && st[0].Resources[0].Health == corev1.ResourceHealthStatusUnhealthy
		return ok, fmt.Sprintf("%+v", st)
	})
}

// TestTopologyAffinityError: under single-numa-node, a pod asking for more devices than one NUMA
// node has is Failed with the kubelet's reason and message, and never retried.
func TestTopologyAffinityError(t *testing.T) {
	ns := namespace(t, "topology")
	config := filepath.Join(shortTempDir(t), "kubelet.yaml")
	writeFile(t, config, `topologyManagerPolicy: single-numa-node
devicelet:
  machine:
    nodes: 2
    cpusPerNode: 2
`)
	n := startNode(t, "node-numa", "--config", config)
	n.plugin(t, "--devices", "4", "--numa-nodes", "2")
	waitForResource(t, n.name, gpu, 4, 4)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "three-gpus", Namespace: ns},
		Spec:       podSpec(n.name, 3),
	}
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	waitFor(t, 60*time.Second, "pod three-gpus Failed", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "three-gpus", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got = p
		return p.Status.Phase == corev1.PodFailed, string(p.Status.Phase)
	})
	if got.Status.Reason != "TopologyAffinityError" ||
		got.Status.Message != "Pod was rejected: Resources cannot be allocated with Topology locality" {
		t.Fatalf("rejected pod status reason %q message %q", got.Status.Reason, got.Status.Message)
	}
	// A pod that fits one NUMA node is admitted beside it.
	fits := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "two-gpus", Namespace: ns}, Spec: podSpec(n.name, 2)}
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), fits, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "pod two-gpus Running", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "two-gpus", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})
	p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "three-gpus", metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodFailed {
		t.Fatalf("the rejected pod changed: %v %v", err, p.Status.Phase)
	}
}
