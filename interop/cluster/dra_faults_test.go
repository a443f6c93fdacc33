package cluster

// DRA faults and health in cluster mode, with the upstream DRA test driver's plugin
// (k8s.io/kubernetes/test/e2e/dra/test-driver/app, the code behind `dra-test-driver
// kubelet-plugin`) running inside the test under the node's identity, as the kubelet's own
// e2e_node DRA tests run it: the test can hold a prepare half-way, count the driver's calls and
// drive its health stream (KEP-4680).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
	"k8s.io/utils/ptr"
)

// inProcessDriver is the test driver's plugin for one node, inside the test process.
type inProcessDriver struct {
	*app.ExamplePlugin
	cdiDir string
	stop   func()
}

// nodeClient is a clientset with the node's own identity (system:node:NAME).
func nodeClient(t *testing.T, n *node) kubernetes.Interface {
	t.Helper()
	config, err := clientcmd.BuildConfigFromFlags("", n.kubeconfig)
	if err != nil {
		t.Fatalf("node kubeconfig: %v", err)
	}
	// The test driver binary's defaults (--kube-api-qps 50, --kube-api-burst 100), not
	// client-go's 5/10, which would make the driver's own claim GETs the bottleneck.
	config.QPS, config.Burst = 50, 100
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// startInProcessDriver runs the test driver's plugin for node n with `devices` devices
// (device-00, ...) in pool n.name, its health service on, writing CDI specs through files
// (nil: plain writes) into cdiDir ("": a new directory). It waits for the driver's slice.
func startInProcessDriver(t *testing.T, n *node, devices int, cdiDir string, files app.FileOperations) *inProcessDriver {
	t.Helper()
	if cdiDir == "" {
		cdiDir = filepath.Join(shortTempDir(t), "cdi")
	}
	if err := os.MkdirAll(cdiDir, 0o750); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(n.root, "plugins", testDriver)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	list := make([]resourcev1.Device, devices)
	for i := range list {
		list[i] = resourcev1.Device{Name: fmt.Sprintf("device-%02d", i)}
	}
	files.DriverResources = &resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{n.name: {Slices: []resourceslice.Slice{{Devices: list}}}},
	}
	runCtx, cancel := context.WithCancel(context.Background())
	plugin, err := app.StartPlugin(runCtx, cdiDir, testDriver, nodeClient(t, n), n.name, files,
		app.Options{EnableHealthService: true},
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(n.root, "plugins_registry")))
	if err != nil {
		cancel()
		t.Fatalf("start the test driver's plugin: %v", err)
	}
	var once sync.Once
	d := &inProcessDriver{ExamplePlugin: plugin, cdiDir: cdiDir}
	d.stop = func() { once.Do(func() { plugin.Stop(); cancel() }) }
	t.Cleanup(d.stop)
	waitFor(t, 60*time.Second, "the driver registered and its slice published", func() (bool, string) {
		got := sliceDevices(t, n.name)
		return plugin.IsRegistered() && got == devices, fmt.Sprintf("registered %v, %d devices", plugin.IsRegistered(), got)
	})
	return d
}

// draTestNode starts node `name` with the in-process test driver (2 devices), a namespace
// and DeviceClass "<name>-gpu" for the driver's devices.
func draTestNode(t *testing.T, name string) (*node, *inProcessDriver, string) {
	t.Helper()
	n := startNode(t, name)
	driver := startInProcessDriver(t, n, 2, "", app.FileOperations{})
	ns := namespace(t, name)
	deviceClass(t, name+"-gpu")
	return n, driver, ns
}

// claimTemplate creates ResourceClaimTemplate "gpu-template" (one request "gpu" of class
// `class`) in namespace ns, unless it exists.
func claimTemplate(t *testing.T, ns, class string) {
	t.Helper()
	template := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-template", Namespace: ns},
		Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: claimSpec(class)},
	}
	_, err := controlPlane.admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx(t), template, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create ResourceClaimTemplate: %v", err)
	}
}

// templatePod creates a pod on n whose claim "gpu" comes from a template of class `class`,
// and waits until it runs. It returns the pod and its generated claim.
func templatePod(t *testing.T, ns, name string, n *node, class string) (*corev1.Pod, *resourcev1.ResourceClaim) {
	t.Helper()
	claimTemplate(t, ns, class)
	claimPod(t, ns, name, n.name, "gpu-template", "")
	pod := waitForPodRunning(t, ns, name)
	return pod, podClaim(t, pod)
}

// podClaim returns the claim generated for the pod's claim "gpu".
func podClaim(t *testing.T, pod *corev1.Pod) *resourcev1.ResourceClaim {
	t.Helper()
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s resourceClaimStatuses = %+v", pod.Name, pod.Status.ResourceClaimStatuses)
	}
	name := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	claim, err := controlPlane.admin.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get claim %s: %v", name, err)
	}
	return claim
}

// unprepareCalls returns the driver's NodeUnprepareResources requests as text (the helper's
// protobuf types print their claims' UIDs).
func unprepareCalls(d *inProcessDriver) []string {
	var calls []string
	for _, call := range d.GetGRPCCalls() {
		if strings.HasSuffix(call.FullMethod, "/NodeUnprepareResources") {
			calls = append(calls, fmt.Sprint(call.Request))
		}
	}
	return calls
}

// draState is `devicelet get dra -o json`: registered drivers and pods waiting for a driver to
// unprepare their claims.
type draState struct {
	Drivers []struct {
		Driver string `json:"driver"`
	} `json:"drivers"`
	PendingUnprepare []string `json:"pendingUnprepare"`
}

func getDRA(t *testing.T, n *node) draState {
	t.Helper()
	var state draState
	out := n.cli(t, "get", "dra", "-o", "json")
	if err := json.Unmarshal([]byte(out), &state); err != nil {
		t.Fatalf("devicelet get dra output %q: %v", out, err)
	}
	return state
}

func pendingUnprepare(t *testing.T, n *node) []string {
	t.Helper()
	return getDRA(t, n).PendingUnprepare
}

// containerHealth returns the main container's allocatedResourcesStatus entry `name` as
// resourceID -> "health" or "health: message" (1.36 ResourceHealth.message, when set).
func containerHealth(p *corev1.Pod, name string) map[string]string {
	out := map[string]string{}
	for _, cs := range p.Status.ContainerStatuses {
		for _, st := range cs.AllocatedResourcesStatus {
			if string(st.Name) != name {
				continue
			}
			for _, r := range st.Resources {
				got := string(r.Health)
				if r.Message != nil {
					got += ": " + *r.Message
				}
				out[string(r.ResourceID)] = got
			}
		}
	}
	return out
}

// KEP-4680 with a DRA driver: the driver's v1alpha1 health stream reaches the pod's
// containerStatuses[].allocatedResourcesStatus ("claim:gpu", resourceID = the device's CDI ID)
// in the API, with the 1.36 per-device message, and a later report replaces it: a new message
// with the same health alone rewrites the status, and an empty message leaves the field unset.
func TestDRAHealthReachesPodStatus(t *testing.T) {
	n, driver, ns := draTestNode(t, "dra-health")
	pod, claim := templatePod(t, ns, "consumer", n, "dra-health-gpu")
	device := claim.Status.Allocation.Devices.Results[0].Device
	cdiID := fmt.Sprintf("%s/test=claim-%s-gpu", testDriver, claim.UID)

	// Let the pod's own status writes and watch events settle: from here only a health report
	// can change the status.
	time.Sleep(3 * time.Second)
	for _, report := range []struct{ health, message, want string }{
		{"Unhealthy", "ECC errors", "Unhealthy: ECC errors"},
		{"Unhealthy", "fan stopped", "Unhealthy: fan stopped"},
		{"Healthy", "", "Healthy"},
	} {
		driver.HealthControlChan <- app.DeviceHealthUpdate{PoolName: n.name, DeviceName: device, Health: report.health, Message: report.message}
		waitFor(t, 30*time.Second, "allocatedResourcesStatus claim:gpu "+report.want, func() (bool, string) {
			p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), pod.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got := containerHealth(p, "claim:gpu")
			return got[cdiID] == report.want, fmt.Sprintf("%v", got)
		})
	}
}

// The kubelet's stuck-termination report (k/k#129402, spec cluster.md §3): a pod whose driver is
// gone can still be deleted. devicelet releases it, the pod object goes, the claim waits in
// `get dra` (pendingUnprepare) and is unprepared through the driver once it is back.
func TestDRAPodOfAGoneDriverIsDeleted(t *testing.T) {
	n, driver, ns := draTestNode(t, "dra-gone")
	pod, claim := templatePod(t, ns, "consumer", n, "dra-gone-gpu")
	spec := cdiSpecPath(driver.cdiDir, string(claim.UID))

	driver.stop()
	waitFor(t, 30*time.Second, "devicelet to notice the driver is gone", func() (bool, string) {
		state := getDRA(t, n)
		return len(state.Drivers) == 0, fmt.Sprintf("%+v", state.Drivers)
	})
	deletePodAndWait(t, ns, "consumer")
	if pending := pendingUnprepare(t, n); len(pending) != 1 || pending[0] != string(pod.UID) {
		t.Fatalf("pendingUnprepare = %v, want [%s] (the claim is still prepared in the driver)", pending, pod.UID)
	}
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("the claim's CDI spec is gone although nobody unprepared it: %v", err)
	}

	back := startInProcessDriver(t, n, 2, driver.cdiDir, app.FileOperations{})
	waitFor(t, 60*time.Second, "the claim unprepared through the returned driver", func() (bool, string) {
		calls := unprepareCalls(back)
		pending := pendingUnprepare(t, n)
		hit := false
		for _, c := range calls {
			hit = hit || strings.Contains(c, string(claim.UID))
		}
		return hit && len(pending) == 0, fmt.Sprintf("unprepare calls %v, pending %v", calls, pending)
	})
}

// devicelet SIGKILLed after the driver prepared a claim (its CDI spec written) but before
// devicelet recorded the result: the restarted devicelet prepares the claim again (the driver
// answers idempotently), the pod runs with the claim's CDI device, and deleting it unprepares
// the claim: nothing is lost or leaked.
func TestDRASigkillBetweenPrepareAndCheckpoint(t *testing.T) {
	n := startNode(t, "dra-crash")
	written := make(chan string, 4)
	release := make(chan struct{})
	var hold sync.Once
	files := app.FileOperations{
		Create: func(name string, content []byte) error {
			if err := os.WriteFile(name, content, 0o644); err != nil {
				return err
			}
			// Hold the first prepare's answer after its side effects are done.
			hold.Do(func() {
				written <- name
				<-release
			})
			return nil
		},
	}
	driver := startInProcessDriver(t, n, 2, "", files)
	ns := namespace(t, "dra-crash")
	deviceClass(t, "dra-crash-gpu")
	claimTemplate(t, ns, "dra-crash-gpu")
	claimPod(t, ns, "consumer", n.name, "gpu-template", "")
	var spec string
	select {
	case spec = <-written:
	case <-time.After(90 * time.Second):
		t.Fatal("the driver was never asked to prepare the claim")
	}
	n.devicelet.kill()
	close(release)

	n.start(t)
	pod := waitForPodRunning(t, ns, "consumer")
	claim := podClaim(t, pod)
	if want := cdiSpecPath(driver.cdiDir, string(claim.UID)); want != spec {
		t.Fatalf("CDI spec written for %s, want %s", spec, want)
	}
	want := fmt.Sprintf("%s/test=claim-%s-gpu", testDriver, claim.UID)
	if got := cdiDevices(t, n, string(pod.UID)); len(got) != 1 || got[0] != want {
		t.Fatalf("devicelet start cdiDevices = %v, want [%s]", got, want)
	}
	if prepared := driver.GetPreparedResources(); len(prepared) != 1 {
		t.Fatalf("driver holds %v prepared claims, want the one", prepared)
	}
	deletePodAndWait(t, ns, "consumer")
	waitForFileGone(t, spec)
	if prepared := driver.GetPreparedResources(); len(prepared) != 0 {
		t.Fatalf("driver still holds %v after the pod was deleted", prepared)
	}
}

// A ResourceClaim deleted (its finalizer removed by force while a pod still uses it) and
// created again with the same name: a pod using the new object waits (Pending, nothing
// prepared) with the kubelet's FailedPrepareDynamicResources event naming the cause, the first
// pod keeps its claim; once the first pod is gone (the old claim unprepared) the waiting pod is
// admitted with the new claim.
func TestDRAClaimRecreatedWithNewUIDWaits(t *testing.T) {
	n, driver, ns := draTestNode(t, "dra-recreate")
	claims := controlPlane.admin.ResourceV1().ResourceClaims(ns)
	newClaim := func() *resourcev1.ResourceClaim {
		c, err := claims.Create(ctx(t), &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: ns},
			Spec:       claimSpec("dra-recreate-gpu"),
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create claim: %v", err)
		}
		return c
	}
	old := newClaim()
	claimPod(t, ns, "first", n.name, "", "shared")
	waitForPodRunning(t, ns, "first")

	if err := claims.Delete(ctx(t), "shared", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The delete protection finalizer keeps a reserved claim; an operator removes it by force.
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := claims.Patch(ctx(t), "shared", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("remove finalizers: %v", err)
	}
	waitFor(t, 30*time.Second, "the old claim gone", func() (bool, string) {
		_, err := claims.Get(ctx(t), "shared", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	fresh := newClaim()
	if fresh.UID == old.UID {
		t.Fatal("recreated claim has the old UID")
	}
	claimPod(t, ns, "second", n.name, "", "shared")
	waitFor(t, 90*time.Second, "a FailedPrepareDynamicResources event for the second pod", func() (bool, string) {
		events, err := controlPlane.admin.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{
			FieldSelector: "involvedObject.name=second,reason=FailedPrepareDynamicResources",
		})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, "different UID") && e.Source.Host == n.name {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(events.Items))
	})
	p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "second", metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodPending {
		t.Fatalf("the second pod: phase %v (%v), want Pending while it waits", p.Status.Phase, err)
	}
	if prepared := driver.GetPreparedResources(); len(prepared) != 1 || prepared[0].UID != old.UID {
		t.Fatalf("driver prepared %v, want only the old claim %s", prepared, old.UID)
	}

	deletePodAndWait(t, ns, "first")
	waitForPodRunning(t, ns, "second")
	if prepared := driver.GetPreparedResources(); len(prepared) != 1 || prepared[0].UID != fresh.UID {
		t.Fatalf("driver prepared %v, want only the new claim %s", prepared, fresh.UID)
	}
}

// Extended resources backed by DRA (KEP-5004, beta and on in 1.36): a DeviceClass names the
// extended resource, a pod asks for it in its limits, kube-scheduler creates the pod's special
// claim and records it in status.extendedResourceClaimStatus; devicelet (which has no device
// plugin for that resource) prepares that claim through the driver and gives the container the
// devices of its mapped request; deleting the pod unprepares it.
func TestDRAExtendedResourceBackedByAClaim(t *testing.T) {
	const resourceName = "example.com/dra-gpu"
	n := startNode(t, "dra-extended")
	driver := startInProcessDriver(t, n, 2, "", app.FileOperations{})
	ns := namespace(t, "dra-extended")
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "dra-extended-gpu"},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{
				CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + testDriver + `"`},
			}},
			ExtendedResourceName: ptr.To(resourceName),
		},
	}
	if _, err := controlPlane.admin.ResourceV1().DeviceClasses().Create(ctx(t), class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass: %v", err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.ResourceV1().DeviceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	spec := podSpec(n.name, 0)
	spec.Containers[0].Resources.Limits = corev1.ResourceList{resourceName: resourceQuantity(1)}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: ns}, Spec: spec}
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	running := waitForPodRunning(t, ns, "consumer")
	status := running.Status.ExtendedResourceClaimStatus
	if status == nil || len(status.RequestMappings) != 1 {
		t.Fatalf("extendedResourceClaimStatus = %+v, want the scheduler's claim with one mapping", status)
	}
	claim, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), status.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get the extended resource claim: %v", err)
	}
	request := status.RequestMappings[0].RequestName
	want := fmt.Sprintf("%s/test=claim-%s-%s", testDriver, claim.UID, request)
	if got := cdiDevices(t, n, string(running.UID)); len(got) != 1 || got[0] != want {
		t.Fatalf("devicelet start cdiDevices = %v, want [%s]", got, want)
	}
	file := filepath.Join(driver.cdiDir, fmt.Sprintf("%s-%s-%s.json", testDriver, claim.UID, request))
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("CDI spec of the extended resource claim: %v", err)
	}
	deletePodAndWait(t, ns, "consumer")
	waitForFileGone(t, file)
}

func resourceQuantity(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }
