package cluster

// DRA in cluster mode with an unmodified upstream driver: the Kubernetes DRA test driver
// (k8s.io/kubernetes/test/e2e/dra/test-driver, subcommand kubelet-plugin) runs as a host process
// with the node's own kubeconfig, registers with devicelet through plugins_registry and publishes
// its ResourceSlices itself (NodeRestriction lets the node identity do that for its own node
// only). kube-controller-manager creates template claims, kube-scheduler allocates and reserves
// them, devicelet reads each claim from the API server, prepares it through the driver and hands
// out its CDI device names.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const testDriver = "test-driver.cdi.k8s.io"

// startTestDriver runs the DRA test driver for node n with n's kubeconfig and returns its CDI
// directory. It waits until the driver's ResourceSlice for the node exists.
func startTestDriver(t *testing.T, n *node, devices int) string {
	t.Helper()
	cdiDir, _ := startTestDriverProcess(t, n, devices)
	return cdiDir
}

// startTestDriverProcess is startTestDriver returning the driver's process too.
func startTestDriverProcess(t *testing.T, n *node, devices int) (string, *process) {
	t.Helper()
	cdiDir := filepath.Join(shortTempDir(t), "cdi")
	// The driver creates only the parent of its socket directory (a kubelet's DaemonSet would
	// mount it).
	if err := os.MkdirAll(filepath.Join(n.root, "plugins", testDriver), 0o750); err != nil {
		t.Fatal(err)
	}
	p := startProgram(t, "dra-test-driver "+n.name, filepath.Join(controlPlane.bin, "dra-test-driver"),
		"--kubeconfig", n.kubeconfig, "-v", "4",
		"kubelet-plugin",
		"--node-name", n.name,
		// The driver adds its name: the DRA socket is <root>/plugins/test-driver.cdi.k8s.io/.
		"--datadir", filepath.Join(n.root, "plugins"),
		"--plugin-registration-path", filepath.Join(n.root, "plugins_registry"),
		"--cdi-dir", cdiDir,
		"--num-devices", fmt.Sprint(devices))
	waitFor(t, 60*time.Second, "the test driver's ResourceSlice", func() (bool, string) {
		select {
		case <-p.exited:
			t.Fatalf("dra-test-driver exited:\n%s", lastLines(p.output.String(), 40))
		default:
		}
		list, err := controlPlane.admin.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{
			FieldSelector: "spec.nodeName=" + n.name + ",spec.driver=" + testDriver,
		})
		if err != nil {
			return false, err.Error()
		}
		count := 0
		for _, s := range list.Items {
			count += len(s.Spec.Devices)
		}
		return count == devices, fmt.Sprintf("%d slices, %d devices", len(list.Items), count)
	})
	return cdiDir, p
}

// deviceClass creates a DeviceClass selecting the test driver's devices (deleted at the end).
func deviceClass(t *testing.T, name string) {
	t.Helper()
	driverClass(t, name, testDriver)
}

// driverClass creates a DeviceClass selecting the devices of `driver` (deleted at the end).
func driverClass(t *testing.T, name, driver string) {
	t.Helper()
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{
				CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + driver + `"`},
			}},
		},
	}
	if _, err := controlPlane.admin.ResourceV1().DeviceClasses().Create(ctx(t), class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass: %v", err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.ResourceV1().DeviceClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func claimSpec(class string) resourcev1.ResourceClaimSpec {
	return resourcev1.ResourceClaimSpec{
		Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{
				Name:    "gpu",
				Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class},
			}},
		},
	}
}

// claimPod is a pod on nodeName whose container uses pod claim "gpu": from template
// `template`, or the ResourceClaim `claim`.
func claimPod(t *testing.T, ns, name, nodeName, template, claim string) *corev1.Pod {
	t.Helper()
	spec := podSpec(nodeName, 0)
	usePodClaim(&spec, template, claim)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	created, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return created
}

// usePodClaim gives the spec's first container pod claim "gpu": from template `template`, or
// the ResourceClaim `claim`.
func usePodClaim(spec *corev1.PodSpec, template, claim string) {
	pc := corev1.PodResourceClaim{Name: "gpu"}
	if template != "" {
		pc.ResourceClaimTemplateName = &template
	} else {
		pc.ResourceClaimName = &claim
	}
	spec.ResourceClaims = []corev1.PodResourceClaim{pc}
	spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
}

// waitForPodRunning waits until the pod runs and returns it.
func waitForPodRunning(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, 90*time.Second, "pod "+name+" Running", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning,
			fmt.Sprintf("node %q phase %s reason %q message %q", p.Spec.NodeName, p.Status.Phase, p.Status.Reason, p.Status.Message)
	})
	return pod
}

// deletePodAndWait deletes the pod gracefully and waits until devicelet finished it (the
// object is gone).
func deletePodAndWait(t *testing.T, ns, name string) {
	t.Helper()
	if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	waitFor(t, 60*time.Second, "pod "+name+" gone", func() (bool, string) {
		_, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// cdiDevices runs `devicelet start POD_UID main -o json` and returns its CDI device names.
func cdiDevices(t *testing.T, n *node, podUID string) []string {
	t.Helper()
	var options struct {
		CDIDevices []string `json:"cdiDevices"`
	}
	out := n.cli(t, "start", podUID, "main", "-o", "json")
	if err := json.Unmarshal([]byte(out), &options); err != nil {
		t.Fatalf("devicelet start output %q: %v", out, err)
	}
	return options.CDIDevices
}

// cachedClaims returns `devicelet get dra`'s claim cache: namespace/name -> pod UIDs.
func cachedClaims(t *testing.T, n *node) map[string][]string {
	t.Helper()
	var snapshot struct {
		CachedClaims map[string][]string `json:"cachedClaims"`
	}
	out := n.cli(t, "get", "dra", "-o", "json")
	if err := json.Unmarshal([]byte(out), &snapshot); err != nil {
		t.Fatalf("devicelet get dra output %q: %v", out, err)
	}
	return snapshot.CachedClaims
}

func cdiSpecPath(cdiDir string, claimUID string) string {
	return filepath.Join(cdiDir, fmt.Sprintf("%s-%s-gpu.json", testDriver, claimUID))
}

func waitForFileGone(t *testing.T, path string) {
	t.Helper()
	waitFor(t, 60*time.Second, "CDI spec "+filepath.Base(path)+" removed", func() (bool, string) {
		_, err := os.Stat(path)
		return os.IsNotExist(err), fmt.Sprint(err)
	})
}

func reservedFor(claim *resourcev1.ResourceClaim) []string {
	var uids []string
	for _, r := range claim.Status.ReservedFor {
		uids = append(uids, string(r.UID))
	}
	return uids
}

// A pod with a ResourceClaimTemplate: claim created by kube-controller-manager, allocated by
// kube-scheduler, prepared by the unmodified test driver through devicelet (CDI spec written),
// pod Running, CDI names at container start; deleting the pod unprepares and the claim goes.
func TestDRATemplateClaim(t *testing.T) {
	n := startNode(t, "dra-template")
	cdiDir := startTestDriver(t, n, 2)
	ns := namespace(t, "dra-template")
	deviceClass(t, "dra-template-gpu")
	claimTemplate(t, ns, "dra-template-gpu")

	claimPod(t, ns, "consumer", n.name, "gpu-template", "")
	pod := waitForPodRunning(t, ns, "consumer")
	if pod.Spec.NodeName != n.name {
		t.Fatalf("pod bound to %q, want %q", pod.Spec.NodeName, n.name)
	}
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod resourceClaimStatuses = %+v, want the generated claim", pod.Status.ResourceClaimStatuses)
	}
	claimName := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	claim, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get claim %s: %v", claimName, err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s not allocated: %+v", claimName, claim.Status)
	}
	if got := reservedFor(claim); len(got) != 1 || got[0] != string(pod.UID) {
		t.Fatalf("claim reserved for %v, want [%s]", got, pod.UID)
	}

	spec := cdiSpecPath(cdiDir, string(claim.UID))
	if _, err := os.Stat(spec); err != nil {
		entries, _ := os.ReadDir(cdiDir)
		t.Fatalf("CDI spec of the prepared claim: %v (CDI dir holds %v)", err, entries)
	}
	want := fmt.Sprintf("%s/test=claim-%s-gpu", testDriver, claim.UID)
	if got := cdiDevices(t, n, string(pod.UID)); len(got) != 1 || got[0] != want {
		t.Fatalf("devicelet start cdiDevices = %v, want [%s]", got, want)
	}
	if cached := cachedClaims(t, n); len(cached[ns+"/"+claimName]) != 1 {
		t.Fatalf("devicelet's claim cache = %v, want %s/%s for the pod", cached, ns, claimName)
	}

	deletePodAndWait(t, ns, "consumer")
	waitForFileGone(t, spec)
	waitFor(t, 60*time.Second, "generated claim "+claimName+" deleted", func() (bool, string) {
		c, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), claimName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("allocated %v reserved for %v", c.Status.Allocation != nil, reservedFor(c))
	})
	if cached := cachedClaims(t, n); len(cached) != 0 {
		t.Fatalf("devicelet's claim cache after the pod = %v, want empty", cached)
	}
}

// A ResourceClaim shared by two pods is prepared once (the driver writes its CDI spec once) and
// unprepared when the last pod goes; the control plane then deallocates it.
func TestDRASharedClaim(t *testing.T) {
	n := startNode(t, "dra-shared")
	cdiDir := startTestDriver(t, n, 2)
	ns := namespace(t, "dra-shared")
	deviceClass(t, "dra-shared-gpu")
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: ns},
		Spec:       claimSpec("dra-shared-gpu"),
	}
	if _, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Create(ctx(t), claim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaim: %v", err)
	}

	claimPod(t, ns, "first", n.name, "", "shared")
	first := waitForPodRunning(t, ns, "first")
	got, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := cdiSpecPath(cdiDir, string(got.UID))
	before, err := os.Stat(spec)
	if err != nil {
		t.Fatalf("CDI spec after the first pod: %v", err)
	}

	claimPod(t, ns, "second", n.name, "", "shared")
	second := waitForPodRunning(t, ns, "second")
	after, err := os.Stat(spec)
	if err != nil {
		t.Fatalf("CDI spec after the second pod: %v", err)
	}
	if !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("CDI spec rewritten (%s -> %s): the shared claim was prepared twice", before.ModTime(), after.ModTime())
	}
	want := fmt.Sprintf("%s/test=claim-%s-gpu", testDriver, got.UID)
	for _, p := range []*corev1.Pod{first, second} {
		if devs := cdiDevices(t, n, string(p.UID)); len(devs) != 1 || devs[0] != want {
			t.Fatalf("pod %s cdiDevices = %v, want [%s]", p.Name, devs, want)
		}
	}
	if pods := cachedClaims(t, n)[ns+"/shared"]; len(pods) != 2 {
		t.Fatalf("claim cache lists %v for the shared claim, want both pods", pods)
	}

	deletePodAndWait(t, ns, "first")
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("CDI spec gone while the second pod still uses the claim: %v", err)
	}
	deletePodAndWait(t, ns, "second")
	waitForFileGone(t, spec)
	waitFor(t, 60*time.Second, "shared claim deallocated", func() (bool, string) {
		c, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), "shared", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0,
			fmt.Sprintf("allocated %v reserved for %v", c.Status.Allocation != nil, strings.Join(reservedFor(c), ","))
	})
}

// sliceDevices counts the devices in the test driver's ResourceSlices on the node.
func sliceDevices(t *testing.T, nodeName string) int {
	t.Helper()
	list, err := controlPlane.admin.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + nodeName + ",spec.driver=" + testDriver,
	})
	if err != nil {
		t.Fatalf("list ResourceSlices: %v", err)
	}
	count := 0
	for _, s := range list.Items {
		count += len(s.Spec.Devices)
	}
	return count
}

// TestDRASlicesOfAGoneDriverAreWipedAfterTheDelay: the kubelet's DRA plugin manager behaviour
// with the node identity (list and deletecollection of its own node's slices): a driver that
// comes back within the 30 s wiping delay keeps its ResourceSlices; one that stays away loses
// them after the delay, not before.
func TestDRASlicesOfAGoneDriverAreWipedAfterTheDelay(t *testing.T) {
	n := startNode(t, "node-slices")
	_, driver := startTestDriverProcess(t, n, 2)

	driver.stop()
	time.Sleep(10 * time.Second)
	if got := sliceDevices(t, n.name); got != 2 {
		t.Fatalf("10 s after the driver stopped its slices list %d devices, want 2 (kept within the delay)", got)
	}
	_, driver = startTestDriverProcess(t, n, 2)
	time.Sleep(25 * time.Second) // past the first deadline
	if got := sliceDevices(t, n.name); got != 2 {
		t.Fatalf("the driver came back within the delay, but its slices list %d devices", got)
	}

	driver.stop()
	stopped := time.Now()
	waitFor(t, 90*time.Second, "the gone driver's slices to be deleted", func() (bool, string) {
		got := sliceDevices(t, n.name)
		return got == 0, fmt.Sprintf("%d devices", got)
	})
	if after := time.Since(stopped); after < 25*time.Second {
		t.Fatalf("slices deleted %s after the driver stopped, before the 30 s delay", after)
	}
}
