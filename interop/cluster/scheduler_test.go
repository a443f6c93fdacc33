package cluster

// devicelet's scheduler (`devicelet scheduler`, issue 25) against the project's control plane:
// pods with schedulerName devicelet-scheduler and template claims (kube-controller-manager
// creates them) are placed on devicelet nodes running the upstream DRA test driver, prepared and
// Running; every allocation is what the upstream Go allocator gives for that node with the other
// claims' devices in use. Also: a claim shared by 20 pods, many pods racing for the last devices
// (nodes as API objects), unschedulable messages, refused pod affinity, leader failover.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

const schedulerName = "devicelet-scheduler"

// schedulerRBAC lets the control plane's kube-scheduler identity keep devicelet-scheduler's own
// Lease (its bootstrap role only covers the Lease named kube-scheduler).
func schedulerRBAC(t *testing.T) {
	t.Helper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "devicelet-scheduler-lease", Namespace: "kube-system"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			ResourceNames: []string{schedulerName}, Verbs: []string{"get", "update"},
		}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "devicelet-scheduler-lease", Namespace: "kube-system"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "system:kube-scheduler"}},
	}
	if _, err := controlPlane.admin.RbacV1().Roles("kube-system").Create(ctx(t), role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := controlPlane.admin.RbacV1().RoleBindings("kube-system").Create(ctx(t), binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// startScheduler runs `devicelet scheduler` as system:kube-scheduler and returns it with its
// metrics address.
func startScheduler(t *testing.T, extra ...string) (*process, string) {
	t.Helper()
	return startSchedulerWith(t, filepath.Join(controlPlane.state, "scheduler.kubeconfig"), extra...)
}

// startSchedulerWith is startScheduler with another kubeconfig (a fault proxy's).
func startSchedulerWith(t *testing.T, kubeconfig string, extra ...string) (*process, string) {
	t.Helper()
	schedulerRBAC(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := append([]string{"scheduler", "--kubeconfig", kubeconfig, "--metrics-address", addr}, extra...)
	p := startProcess(t, "devicelet scheduler", args...)
	// Live first, then ready: /readyz answers 200 once the caches have synced.
	for _, path := range []string{"/healthz", "/readyz"} {
		waitFor(t, 30*time.Second, "scheduler "+path, func() (bool, string) {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == 200, resp.Status
		})
	}
	return p, addr
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// schedPod creates a pod for devicelet's scheduler with one template (or named) claim "gpu".
func schedPod(t *testing.T, ns, name, template, claim string, mutate func(*corev1.PodSpec)) {
	t.Helper()
	spec := podSpec("", 0)
	spec.SchedulerName = schedulerName
	if template != "" || claim != "" {
		usePodClaim(&spec, template, claim)
	}
	if mutate != nil {
		mutate(&spec)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
}

// createTemplatePods creates pods PREFIX0..PREFIX<n-1> in ns for `scheduler`, each with the
// template claim "gpu", `workers` at a time; mutate (may be nil) changes each spec.
func createTemplatePods(t *testing.T, c kubernetes.Interface, ns, prefix, scheduler string, n, workers int, mutate func(*corev1.PodSpec)) {
	t.Helper()
	err := parallel(n, workers, func(i int) error {
		spec := podSpec("", 0)
		spec.SchedulerName = scheduler
		usePodClaim(&spec, "gpu", "")
		if mutate != nil {
			mutate(&spec)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", prefix, i), Namespace: ns}, Spec: spec}
		_, err := c.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("create pods in %s: %v", ns, err)
	}
}

// waitForPodClaims waits until kube-controller-manager created the template claim of each of
// the n pods of ns.
func waitForPodClaims(t *testing.T, c kubernetes.Interface, ns string, n int, timeout time.Duration) {
	t.Helper()
	waitForEvery(t, timeout, 2*time.Second, ns+": every pod's claim created", func() (bool, string) {
		list, err := c.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for i := range list.Items {
			if podClaimName(&list.Items[i]) != "" {
				ready++
			}
		}
		return ready == n, fmt.Sprintf("%d of %d pods have their claim", ready, n)
	})
}

// podClaimName is the claim a pod's "gpu" entry resolves to.
func podClaimName(p *corev1.Pod) string {
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == "gpu" && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	for _, c := range p.Spec.ResourceClaims {
		if c.Name == "gpu" && c.ResourceClaimName != nil {
			return *c.ResourceClaimName
		}
	}
	return ""
}

type oracleLister struct{ classes []*resourcev1.DeviceClass }

func (l *oracleLister) List() ([]*resourcev1.DeviceClass, error) { return l.classes, nil }
func (l *oracleLister) Get(name string) (*resourcev1.DeviceClass, error) {
	for _, c := range l.classes {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, name)
}

// checkAgainstGoAllocator asserts that no device is allocated twice and that each allocated
// claim got what the upstream allocator gives on its node, with every other claim's devices in
// use (first fit over the same slices: with one device per claim and no claim freed, that is
// the device the claim got when it was allocated).
func checkAgainstGoAllocator(t *testing.T, ns string) int {
	t.Helper()
	claims, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	all, err := controlPlane.admin.ResourceV1().ResourceClaims("").List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices, err := controlPlane.admin.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	classes, err := controlPlane.admin.ResourceV1().DeviceClasses().List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lister := &oracleLister{}
	for i := range classes.Items {
		lister.classes = append(lister.classes, &classes.Items[i])
	}
	var slicePtrs []*resourcev1.ResourceSlice
	for i := range slices.Items {
		slicePtrs = append(slicePtrs, &slices.Items[i])
	}
	owner := map[string]string{}
	for _, c := range all.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			id := r.Driver + "/" + r.Pool + "/" + r.Device
			if prev, dup := owner[id]; dup {
				t.Errorf("device %s allocated twice: %s and %s/%s", id, prev, c.Namespace, c.Name)
			}
			owner[id] = c.Namespace + "/" + c.Name
		}
	}
	checked := 0
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		sel := c.Status.Allocation.NodeSelector
		if sel == nil || len(sel.NodeSelectorTerms) != 1 || len(sel.NodeSelectorTerms[0].MatchFields) != 1 {
			t.Errorf("claim %s: allocation node selector %v is not one node", c.Name, sel)
			continue
		}
		nodeName := sel.NodeSelectorTerms[0].MatchFields[0].Values[0]
		node, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		state := structured.AllocatedState{
			AllocatedDevices:         sets.New[structured.DeviceID](),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		}
		for _, o := range all.Items {
			if o.UID == c.UID || o.Status.Allocation == nil {
				continue
			}
			for _, r := range o.Status.Allocation.Devices.Results {
				state.AllocatedDevices.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
			}
		}
		unallocated := c.DeepCopy()
		unallocated.Status = resourcev1.ResourceClaimStatus{}
		alloc, err := structured.NewAllocator(ctx(t), structured.Features{
			AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
			DeviceBindingAndStatus: true, ConsumableCapacity: true,
		}, state, lister, slicePtrs, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := alloc.Allocate(ctx(t), node, []*resourcev1.ResourceClaim{unallocated})
		if err != nil || len(res) != 1 {
			t.Errorf("claim %s: Go allocator on %s: %v (%d results)", c.Name, nodeName, err, len(res))
			continue
		}
		got, want := deviceList(c.Status.Allocation.Devices.Results), deviceList(res[0].Devices.Results)
		if got != want {
			t.Errorf("claim %s on %s: devicelet allocated %s, the Go allocator gives %s", c.Name, nodeName, got, want)
		}
		checked++
	}
	return checked
}

func deviceList(results []resourcev1.DeviceRequestAllocationResult) string {
	var out []string
	for _, r := range results {
		out = append(out, r.Request+"="+r.Driver+"/"+r.Pool+"/"+r.Device)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func TestSchedulerTemplateClaimsOnDeviceletNodes(t *testing.T) {
	ns := namespace(t, "sched-tmpl")
	nodes := []*node{startNode(t, "sched-a"), startNode(t, "sched-b")}
	for _, n := range nodes {
		startTestDriver(t, n, 4)
	}
	deviceClass(t, "sched-gpu")
	createTemplate(t, ns, "gpu", claimSpec("sched-gpu"))
	_, metrics := startScheduler(t)
	const pods = 6
	for i := 0; i < pods; i++ {
		schedPod(t, ns, fmt.Sprintf("p%d", i), "gpu", "", nil)
	}
	perNode := map[string]int{}
	for i := 0; i < pods; i++ {
		p := waitForPodRunning(t, ns, fmt.Sprintf("p%d", i))
		perNode[p.Spec.NodeName]++
		claim, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), podClaimName(p), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !sets.New(claim.Finalizers...).Has("resource.kubernetes.io/delete-protection") {
			t.Errorf("claim %s has no delete-protection finalizer: %v", claim.Name, claim.Finalizers)
		}
		if got := reservedFor(claim); len(got) != 1 || got[0] != string(p.UID) {
			t.Errorf("claim %s reservedFor %v, want [%s]", claim.Name, got, p.UID)
		}
	}
	if len(perNode) != 2 {
		t.Errorf("pods per node %v: LeastAllocated should spread them over both nodes", perNode)
	}
	if n := checkAgainstGoAllocator(t, ns); n != pods {
		t.Errorf("checked %d allocations against the Go allocator, want %d", n, pods)
	}
	text := scrape(t, metrics)
	if !strings.Contains(text, `scheduler_schedule_attempts_total{result="scheduled",profile="devicelet-scheduler"}`) {
		t.Errorf("metrics lack scheduled attempts:\n%s", text)
	}
	// Pods of other schedulers are never touched: a pod for a scheduler that does not exist
	// stays pending without a condition from us.
	other := podSpec("", 0)
	other.SchedulerName = "nobody"
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns}, Spec: other}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" || len(p.Status.Conditions) != 0 {
		t.Errorf("a pod of another scheduler was touched: node %q conditions %v", p.Spec.NodeName, p.Status.Conditions)
	}
}

// apiNode creates a Node object (no agent) with a ResourceSlice of `devices` devices of
// sched.example.com.
func apiNode(t *testing.T, name string, devices int) {
	t.Helper()
	apiNodeFor(t, name, devices, "sched.example.com")
}

// apiNodeFor is apiNode with the devices of `driver`.
func apiNodeFor(t *testing.T, name string, devices int, driver string) {
	t.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "devicelet.dev/api-only": "true"}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"cpu": resource.MustParse("32"), "memory": resource.MustParse("128Gi"), "pods": resource.MustParse("1000")},
			Allocatable: corev1.ResourceList{"cpu": resource.MustParse("32"), "memory": resource.MustParse("128Gi"), "pods": resource.MustParse("1000")},
		},
	}
	if _, err := controlPlane.admin.CoreV1().Nodes().Create(ctx(t), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Status is not taken on create; the node lifecycle controller may write it meanwhile.
	waitFor(t, 30*time.Second, "node "+name+" allocatable", func() (bool, string) {
		current, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		current.Status.Capacity, current.Status.Allocatable = node.Status.Capacity, node.Status.Allocatable
		_, err = controlPlane.admin.CoreV1().Nodes().UpdateStatus(ctx(t), current, metav1.UpdateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	t.Cleanup(func() {
		_ = controlPlane.admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	var devs []resourcev1.Device
	for i := 0; i < devices; i++ {
		devs = append(devs, gpuDevice(fmt.Sprintf("gpu-%d", i), "a100", int64(i%2)))
	}
	createSlice(t, name+"-slice", name, driver, 1, 1, devs...)
}

// placement counts the pods of ns whose name starts with prefix: bound, and not bound with
// PodScheduled=False reason Unschedulable.
func placement(t *testing.T, ns, prefix string) (bound, unschedulable int, err error) {
	t.Helper()
	list, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	for _, p := range list.Items {
		if !strings.HasPrefix(p.Name, prefix) {
			continue
		}
		if p.Spec.NodeName != "" {
			bound++
		} else if c := podScheduledCondition(&p); c != nil && c.Reason == "Unschedulable" {
			unschedulable++
		}
	}
	return bound, unschedulable, nil
}

func podScheduledCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodScheduled {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func TestSchedulerRaceForTheLastDevicesAndMessages(t *testing.T) {
	ns := namespace(t, "sched-race")
	const nodes, devicesPerNode = 10, 10
	for i := 0; i < nodes; i++ {
		apiNode(t, fmt.Sprintf("race-%d", i), devicesPerNode)
	}
	driverClass(t, "race-gpu", "sched.example.com")
	// Opaque driver configuration: /debug/snapshot must not show it (it may hold credentials).
	withConfig := claimSpec("race-gpu")
	withConfig.Devices.Config = []resourcev1.DeviceClaimConfiguration{{
		Requests: []string{"gpu"},
		DeviceConfiguration: resourcev1.DeviceConfiguration{Opaque: &resourcev1.OpaqueDeviceConfiguration{
			Driver:     "sched.example.com",
			Parameters: runtime.RawExtension{Raw: []byte(`{"token":"race-s3cr3t"}`)},
		}},
	}}
	createTemplate(t, ns, "gpu", withConfig)
	createTemplate(t, ns, "h100", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
		request("gpu", "race-gpu", 1, `device.attributes["sched.example.com"].model == "h100"`),
	}}})
	_, metricsAddr := startScheduler(t)
	// A selector nothing matches: the condition says which.
	schedPod(t, ns, "wants-h100", "h100", "", nil)
	// A claim that does not exist: VolumeBinding's PreFilter says which.
	schedPod(t, ns, "volume", "", "", func(s *corev1.PodSpec) {
		s.Volumes = append(s.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
		}})
	})
	total := envInt("SCHEDULER_RACE_PODS", 1000)
	capacity := nodes * devicesPerNode
	start := time.Now()
	createTemplatePods(t, controlPlane.admin, ns, "r", schedulerName, total, 8, nil)
	var bound int
	waitForEvery(t, 300*time.Second, 2*time.Second, "every racing pod bound or unschedulable", func() (bool, string) {
		var unschedulable int
		var err error
		bound, unschedulable, err = placement(t, ns, "r")
		if err != nil {
			return false, err.Error()
		}
		return bound == capacity && bound+unschedulable == total, fmt.Sprintf("%d bound, %d unschedulable of %d", bound, unschedulable, total)
	})
	t.Logf("%d pods raced for %d devices: %d bound in %v", total, capacity, bound, time.Since(start))
	checkAgainstGoAllocator(t, ns)
	p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), fmt.Sprintf("r%d", total-1), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "wants-h100 unschedulable with the selector named", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "wants-h100", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := podScheduledCondition(p)
		if c == nil {
			return false, "no condition"
		}
		return c.Reason == "Unschedulable" && strings.Contains(c.Message, "cannot allocate all claims") &&
			strings.Contains(c.Message, `model == "h100"`), c.Message
	})
	waitFor(t, 30*time.Second, "PVC pod unschedulable with the claim named", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "volume", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := podScheduledCondition(p)
		if c == nil {
			return false, "no condition"
		}
		events, err := controlPlane.admin.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=volume,reason=FailedScheduling"})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName == "" && strings.Contains(c.Message, `persistentvolumeclaim "data" not found`) && len(events.Items) > 0, c.Message
	})
	if c := podScheduledCondition(p); p.Spec.NodeName == "" && (c == nil || !strings.HasPrefix(c.Message, fmt.Sprintf("0/%d nodes are available: %d cannot allocate all claims.", nodes, nodes))) {
		t.Errorf("an unplaced racing pod's condition: %v", c)
	}
	// The scheduler's own view, as `devicelet snapshot` would write it: the 100 allocated
	// claims of this namespace and every pending pod with a claim.
	resp, err := http.Get("http://" + metricsAddr + "/debug/snapshot")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), "race-s3cr3t") || !strings.Contains(string(body), "devicelet.dev/redacted") {
		t.Errorf("/debug/snapshot shows the claims' opaque configuration instead of redacting it")
	}
	// Asked for on its own path (RBAC can grant one without the other), it is all there.
	if unredacted, err := http.Get("http://" + metricsAddr + "/debug/snapshot/unredacted"); err != nil {
		t.Error(err)
	} else {
		full, _ := io.ReadAll(unredacted.Body)
		unredacted.Body.Close()
		if !strings.Contains(string(full), "race-s3cr3t") {
			t.Errorf("/debug/snapshot/unredacted does not show the opaque configuration")
		}
	}
	var scenario struct {
		Kind      string `json:"kind"`
		Allocated struct {
			Claims []resourcev1.ResourceClaim `json:"claims"`
		} `json:"allocated"`
		Pods []struct {
			Name string `json:"name"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(body, &scenario); err != nil {
		t.Fatalf("/debug/snapshot: %v", err)
	}
	allocatedHere := 0
	for _, c := range scenario.Allocated.Claims {
		if c.Namespace == ns {
			allocatedHere++
		}
	}
	if scenario.Kind != "AllocationScenario" || allocatedHere != capacity || len(scenario.Pods) != total-capacity+1 {
		t.Errorf("/debug/snapshot: kind %q, %d allocated claims in %s (want %d), %d pending pods (want %d)",
			scenario.Kind, allocatedHere, ns, capacity, len(scenario.Pods), total-capacity+1)
	}
}

func TestSchedulerSharedClaimTwentyPods(t *testing.T) {
	ns := namespace(t, "sched-shared")
	apiNode(t, "shared-0", 2)
	driverClass(t, "shared-gpu", "sched.example.com")
	createClaim(t, ns, "shared", claimSpec("shared-gpu"))
	startScheduler(t)
	const pods = 20
	for i := 0; i < pods; i++ {
		schedPod(t, ns, fmt.Sprintf("s%d", i), "", "shared", nil)
	}
	waitForEvery(t, 90*time.Second, time.Second, "20 pods bound, all in reservedFor", func() (bool, string) {
		claim, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), "shared", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		bound, _, err := placement(t, ns, "s")
		if err != nil {
			return false, err.Error()
		}
		return bound == pods && len(claim.Status.ReservedFor) == pods,
			fmt.Sprintf("%d bound, reservedFor %d", bound, len(claim.Status.ReservedFor))
	})
}

func TestSchedulerLeaderFailover(t *testing.T) {
	ns := namespace(t, "sched-ha")
	apiNode(t, "ha-0", 10)
	driverClass(t, "ha-gpu", "sched.example.com")
	createTemplate(t, ns, "gpu", claimSpec("ha-gpu"))
	first, _ := startScheduler(t, "--leader-elect")
	waitFor(t, 30*time.Second, "a leader", func() (bool, string) {
		l, err := controlPlane.admin.CoordinationV1().Leases("kube-system").Get(ctx(t), schedulerName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", ""
	})
	second, _ := startScheduler(t, "--leader-elect")
	schedPod(t, ns, "before", "gpu", "", nil)
	waitForBound(t, ns, "before", 30*time.Second)
	killed := time.Now()
	first.kill()
	schedPod(t, ns, "after", "gpu", "", nil)
	waitForBound(t, ns, "after", 60*time.Second)
	t.Logf("the standby took over and bound a pod %v after the leader was SIGKILLed", time.Since(killed))
	if time.Since(killed) < 5*time.Second {
		t.Errorf("bound %v after the kill: the standby did not wait for the lease to expire", time.Since(killed))
	}
	// A leader stopped by SIGTERM (a rollout, a deleted pod) releases the Lease on its way
	// out: the next standby leads at its next retry (2 s), not after the 15 s lease.
	holder := func() string {
		l, err := controlPlane.admin.CoordinationV1().Leases("kube-system").Get(ctx(t), schedulerName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	leading := holder()
	startScheduler(t, "--leader-elect")
	stopped := time.Now()
	second.stop()
	if !strings.Contains(second.output.String(), "released the leader lease") {
		t.Errorf("the leader did not release its Lease on SIGTERM:\n%s", lastLines(second.output.String(), 20))
	}
	waitFor(t, 3*time.Second, "the standby leads within 3 s of the leader's SIGTERM", func() (bool, string) {
		h := holder()
		return h != "" && h != leading, h
	})
	t.Logf("the standby led %v after the leader's SIGTERM", time.Since(stopped))
	schedPod(t, ns, "third", "gpu", "", nil)
	waitForBound(t, ns, "third", 30*time.Second)
}

func waitForBound(t *testing.T, ns, name string, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "pod "+name+" bound", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName != "", "pending"
	})
}

// extPod creates a pod for devicelet's scheduler asking for n of extended resource `res`.
func extPod(t *testing.T, ns, name, res string, n int64) {
	t.Helper()
	schedPod(t, ns, name, "", "", func(s *corev1.PodSpec) {
		q := *resource.NewQuantity(n, resource.DecimalSI)
		s.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceName(res): q}
		s.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(res): q}
	})
}

// Extended resources backed by DRA (KEP-5004): a pod asking for example.com/ext-gpu, which no
// node advertises but a DeviceClass names, gets a special claim created by the scheduler (the
// pod as controller owner, the annotation), allocated and reserved, and named in the pod's
// status.extendedResourceClaimStatus; the allocation is the Go allocator's. A pod asking for
// more than is left is unschedulable until the first pod's claim is gone with its pod.
func TestSchedulerExtendedResourcesBackedByDRA(t *testing.T) {
	ns := namespace(t, "sched-ext")
	apiNodeFor(t, "ext-0", 4, "ext.example.com")
	const res = "example.com/ext-gpu"
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "ext-gpu"},
		Spec: resourcev1.DeviceClassSpec{
			Selectors:            []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "ext.example.com"`}}},
			ExtendedResourceName: ptr.To(res),
		},
	}
	if _, err := controlPlane.admin.ResourceV1().DeviceClasses().Create(ctx(t), class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.ResourceV1().DeviceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	startScheduler(t)
	extPod(t, ns, "two", res, 2)
	waitForBound(t, ns, "two", 30*time.Second)
	pod, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "two", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	status := pod.Status.ExtendedResourceClaimStatus
	if status == nil || status.ResourceClaimName == "" || len(status.RequestMappings) != 1 ||
		status.RequestMappings[0] != (corev1.ContainerExtendedResourceRequest{ContainerName: "main", ResourceName: res, RequestName: "container-0-request-0"}) {
		t.Fatalf("pod status extendedResourceClaimStatus: %+v", status)
	}
	claim, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), status.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := metav1.GetControllerOf(claim)
	if claim.Annotations["resource.kubernetes.io/extended-resource-claim"] != "true" || owner == nil || owner.UID != pod.UID {
		t.Errorf("special claim metadata: annotations %v, controller %v", claim.Annotations, owner)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 2 {
		t.Fatalf("special claim allocation: %+v", claim.Status.Allocation)
	}
	if got := reservedFor(claim); len(got) != 1 || got[0] != string(pod.UID) {
		t.Errorf("special claim reservedFor %v", got)
	}
	if n := checkAgainstGoAllocator(t, ns); n != 1 {
		t.Errorf("%d claims checked against the Go allocator, want 1", n)
	}

	extPod(t, ns, "three", res, 3)
	waitFor(t, 30*time.Second, "three: unschedulable (2 of 4 devices left)", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "three", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := podScheduledCondition(p)
		if c == nil {
			return false, "no condition"
		}
		return p.Spec.NodeName == "" && c.Reason == "Unschedulable" && strings.Contains(c.Message, "cannot allocate all claims"), c.Message
	})
	if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), "two", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitForBound(t, ns, "three", 90*time.Second)
}

// A new leader that finds a backlog of unschedulable pods (here 900, as a deleted namespace
// left them when a leader took over in CI) keeps renewing its Lease while it reports them all:
// the condition and event writes are bounded, so they neither starve the process nor flood
// the API server, and a standby never takes over from a live leader.
func TestSchedulerLeaderKeepsItsLeaseUnderABacklog(t *testing.T) {
	ns := namespace(t, "sched-backlog")
	apiNode(t, "backlog-0", 1)
	const n = 900
	err := parallel(n, 16, func(i int) error {
		spec := podSpec("", 0)
		spec.SchedulerName = schedulerName
		spec.NodeSelector = map[string]string{"devicelet.dev/no-such-node": "x"}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("b%d", i), Namespace: ns}, Spec: spec}
		_, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// An earlier test's scheduler may have held the Lease when it was stopped: it stays
	// theirs until it expires, and only this scheduler's renewals are looked at.
	holder := func() (string, *metav1.MicroTime) {
		l, err := controlPlane.admin.CoordinationV1().Leases("kube-system").Get(ctx(t), schedulerName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return "", nil
		}
		return *l.Spec.HolderIdentity, l.Spec.RenewTime
	}
	before, _ := holder()
	start := time.Now()
	startScheduler(t, "--leader-elect")
	var oldest time.Duration
	samples := 0
	waitForEvery(t, 180*time.Second, time.Second, "every backlog pod reported unschedulable", func() (bool, string) {
		if who, renewed := holder(); who != "" && who != before && renewed != nil {
			samples++
			if age := time.Since(renewed.Time); age > oldest {
				oldest = age
			}
		}
		_, unschedulable, err := placement(t, ns, "b")
		if err != nil {
			return false, err.Error()
		}
		return unschedulable == n && samples > 0, fmt.Sprintf("%d of %d unschedulable; Lease at most %v old over %d looks", unschedulable, n, oldest, samples)
	})
	t.Logf("%d unschedulable pods reported in %v; the Lease was at most %v old", n, time.Since(start), oldest)
	// Renewed every 2 s; 10 s is the renew deadline, after which the leader would step down.
	if oldest > 8*time.Second {
		t.Fatalf("the leader's Lease went %v without renewal while it reported the backlog", oldest)
	}
}
