package cluster

// `devicelet explain` and `devicelet snapshot` against the project's control plane (issue 19,
// items 1 and 2): pods left pending by the real kube-scheduler for each reason a DRA claim does
// not allocate, each explained by devicelet with the admin's read-only view of the API; a pod
// that fits is explained as allocatable with the devices the scheduler then really allocates;
// a snapshot of the cluster replays with `devicelet allocate` to the same decisions.
//
// ResourceSlices are created directly through the API as an admin (no driver is needed for a
// pod to stay pending), after the devicelet node started: devicelet only wipes, at start, the
// slices of drivers that are not connected.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// explainReport is `devicelet explain -o json`.
type explainReport struct {
	Target    string `json:"target"`
	Phase     string `json:"phase"`
	BoundNode string `json:"boundNode"`
	Scheduler string `json:"scheduler"`
	Claims    []struct {
		PodClaim    string   `json:"podClaim"`
		Claim       string   `json:"claim"`
		Template    string   `json:"template"`
		State       string   `json:"state"`
		AllocatedOn string   `json:"allocatedOn"`
		Devices     []string `json:"devices"`
		ReservedFor []string `json:"reservedFor"`
		Message     string   `json:"message"`
	} `json:"claims"`
	Nodes []struct {
		Node    string `json:"node"`
		Outcome string `json:"outcome"`
		Error   string `json:"error"`
		Devices []struct {
			Claim   string `json:"claim"`
			Request string `json:"request"`
			Device  string `json:"device"`
		} `json:"devices"`
		Explanation *struct {
			Pools           int      `json:"pools"`
			IncompletePools []string `json:"incompletePools"`
			Requests        []struct {
				Claim              string `json:"claim"`
				Request            string `json:"request"`
				Candidates         int    `json:"candidates"`
				Usable             int    `json:"usable"`
				InUse              int    `json:"inUse"`
				Tainted            int    `json:"tainted"`
				RejectedBySelector []struct {
					Selector   string `json:"selector"`
					Expression string `json:"expression"`
					Rejected   int    `json:"rejected"`
					Nearest    []struct {
						Device     string            `json:"device"`
						Attributes map[string]string `json:"attributes"`
					} `json:"nearest"`
				} `json:"rejectedBySelector"`
				SelectorErrors    []string `json:"selectorErrors"`
				UntoleratedTaints []string `json:"untoleratedTaints"`
				InUseDevices      []string `json:"inUseDevices"`
				Verdict           string   `json:"verdict"`
			} `json:"requests"`
			Constraints []struct {
				Constraint string         `json:"constraint"`
				Values     map[string]int `json:"values"`
				Verdict    string         `json:"verdict"`
			} `json:"constraints"`
		} `json:"explanation"`
		InUseBy []struct {
			Device string   `json:"device"`
			HeldBy []string `json:"heldBy"`
		} `json:"inUseBy"`
		Notes []string `json:"notes"`
	} `json:"nodes"`
	Notes   []string `json:"notes"`
	Summary string   `json:"summary"`
}

func adminKubeconfig() string { return filepath.Join(controlPlane.state, "admin.kubeconfig") }

// devicelet runs a devicelet command (no root directory needed) and returns stdout.
func devicelet(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Getenv("DEVICELET_BIN"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("devicelet %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// explainPod runs `devicelet explain` as JSON (and logs the table form, the text users see).
func explainPod(t *testing.T, ns, target string, extra ...string) explainReport {
	t.Helper()
	base := []string{"explain", target, "-n", ns, "--kubeconfig", adminKubeconfig()}
	table := devicelet(t, append(append(base, extra...), "-o", "table")...)
	t.Logf("devicelet explain %s -n %s:\n%s", target, ns, table)
	var r explainReport
	out := devicelet(t, append(append(base, extra...), "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("explain output %q: %v", out, err)
	}
	return r
}

// gpuDevice is a device with a string model and an int numa attribute.
func gpuDevice(name, model string, numa int64) resourcev1.Device {
	return resourcev1.Device{
		Name: name,
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"model": {StringValue: ptr.To(model)},
			"numa":  {IntValue: ptr.To(numa)},
		},
	}
}

// createSlice publishes a ResourceSlice for node as an admin (deleted at the end).
func createSlice(t *testing.T, name, node, driver string, generation, count int64, devices ...resourcev1.Device) {
	t.Helper()
	slice := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(node),
			Pool:     resourcev1.ResourcePool{Name: node, Generation: generation, ResourceSliceCount: count},
			Devices:  devices,
		},
	}
	if _, err := controlPlane.admin.ResourceV1().ResourceSlices().Create(ctx(t), slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceSlice %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.ResourceV1().ResourceSlices().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// createClaim creates a ResourceClaim with the given spec.
func createClaim(t *testing.T, ns, name string, spec resourcev1.ResourceClaimSpec) {
	t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	if _, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Create(ctx(t), claim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaim %s: %v", name, err)
	}
}

// createTemplate creates a ResourceClaimTemplate with the given spec.
func createTemplate(t *testing.T, ns, name string, spec resourcev1.ResourceClaimSpec) {
	t.Helper()
	tpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: spec},
	}
	if _, err := controlPlane.admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx(t), tpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaimTemplate: %v", err)
	}
}

// request is one ExactCount request of class with optional CEL selectors.
func request(name, class string, count int64, selectors ...string) resourcev1.DeviceRequest {
	r := resourcev1.DeviceRequest{Name: name, Exactly: &resourcev1.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count,
	}}
	for _, s := range selectors {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: s}})
	}
	return r
}

// waitingPod creates a pod on node (nodeSelector) using claim (or template) as pod claim "gpu";
// gated pods wait behind a scheduling gate.
func waitingPod(t *testing.T, ns, name, nodeName, template, claim string, gated bool) {
	t.Helper()
	spec := podSpec(nodeName, 0)
	usePodClaim(&spec, template, claim)
	if gated {
		spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/explain-first"}}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
}

// waitUnschedulable waits until kube-scheduler tried the pod and left it pending; returns its
// PodScheduled message.
func waitUnschedulable(t *testing.T, ns, name string) string {
	t.Helper()
	message := ""
	waitFor(t, 60*time.Second, "pod "+name+" unschedulable", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s was scheduled to %s", name, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			// Unschedulable, or SchedulerError when a selector fails at run time.
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse &&
				(c.Reason == corev1.PodReasonUnschedulable || c.Reason == corev1.PodReasonSchedulerError) {
				message = c.Message
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %+v", p.Status.Conditions)
	})
	t.Logf("kube-scheduler: %s", message)
	return message
}

// onlyNode returns the report's single node entry.
func onlyNode(t *testing.T, r explainReport) int {
	t.Helper()
	if len(r.Nodes) != 1 {
		t.Fatalf("explained on %d nodes, want 1: %+v", len(r.Nodes), r.Nodes)
	}
	if r.Nodes[0].Outcome == "Allocated" {
		t.Fatalf("explain says the claims fit: %+v", r.Nodes[0])
	}
	return 0
}

func contains(list []string, part string) bool {
	for _, s := range list {
		if strings.Contains(s, part) {
			return true
		}
	}
	return false
}

// No driver publishes anything on the node: a template claim (created by
// kube-controller-manager) pends; explain names the driver that published nothing.
func TestExplainNoSlicesFromTheDriver(t *testing.T) {
	n := startNode(t, "ex-noslices")
	ns := namespace(t, "ex-noslices")
	driverClass(t, "ex-noslices", "absent.explain.example.com")
	createTemplate(t, ns, "one", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-noslices", 1)},
	}})
	waitingPod(t, ns, "pending", n.name, "one", "", false)
	msg := waitUnschedulable(t, ns, "pending")
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Logf("scheduler message without the DRA reason: %q", msg)
	}
	r := explainPod(t, ns, "pod/pending")
	if len(r.Claims) != 1 || r.Claims[0].State == "Allocated" || r.Claims[0].State == "Missing" {
		t.Fatalf("claims = %+v", r.Claims)
	}
	i := onlyNode(t, r)
	req := r.Nodes[i].Explanation.Requests[0]
	if req.Candidates != 0 || !strings.HasPrefix(req.Verdict, "no devices: no ResourceSlice") {
		t.Fatalf("request = %+v", req)
	}
	if !contains(r.Nodes[i].Notes, "driver absent.explain.example.com has published no ResourceSlice at all") {
		t.Fatalf("notes = %v", r.Nodes[i].Notes)
	}
	if !strings.Contains(r.Summary, "cannot be allocated on any of 1") {
		t.Fatalf("summary = %q", r.Summary)
	}
}

// A claim's CEL selector is false for every device: explain names the expression and shows
// the attribute it reads on the nearest devices.
func TestExplainSelectorFalse(t *testing.T) {
	const driver = "sel.explain.example.com"
	n := startNode(t, "ex-selector")
	ns := namespace(t, "ex-selector")
	driverClass(t, "ex-selector", driver)
	createSlice(t, "ex-selector", n.name, driver, 1, 1, gpuDevice("gpu-0", "a100", 0), gpuDevice("gpu-1", "a100", 1))
	expr := `device.attributes["` + driver + `"].model == "h100"`
	createClaim(t, ns, "h100", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-selector", 1, expr)},
	}})
	waitingPod(t, ns, "pending", n.name, "", "h100", false)
	waitUnschedulable(t, ns, "pending")
	r := explainPod(t, ns, "pod/pending")
	req := r.Nodes[onlyNode(t, r)].Explanation.Requests[0]
	if req.Candidates != 2 || req.Usable != 0 || len(req.RejectedBySelector) != 1 {
		t.Fatalf("request = %+v", req)
	}
	rej := req.RejectedBySelector[0]
	if rej.Expression != expr || rej.Rejected != 2 || !strings.HasPrefix(rej.Selector, "claim selector #0") {
		t.Fatalf("rejection = %+v", rej)
	}
	if len(rej.Nearest) != 2 || rej.Nearest[0].Attributes[driver+"/model"] != `"a100"` {
		t.Fatalf("nearest devices = %+v", rej.Nearest)
	}
}

// A selector that fails at run time (an attribute no device has): explain reports the CEL
// error, as the scheduler does.
func TestExplainSelectorError(t *testing.T) {
	const driver = "err.explain.example.com"
	n := startNode(t, "ex-selerr")
	ns := namespace(t, "ex-selerr")
	driverClass(t, "ex-selerr", driver)
	createSlice(t, "ex-selerr", n.name, driver, 1, 1, gpuDevice("gpu-0", "a100", 0))
	createClaim(t, ns, "bad", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-selerr", 1, `device.attributes["`+driver+`"].memory > 10`)},
	}})
	waitingPod(t, ns, "pending", n.name, "", "bad", false)
	waitUnschedulable(t, ns, "pending")
	r := explainPod(t, ns, "pod/pending")
	node := r.Nodes[onlyNode(t, r)]
	req := node.Explanation.Requests[0]
	if len(req.SelectorErrors) == 0 || !strings.Contains(req.SelectorErrors[0], "no such key") {
		t.Fatalf("request = %+v", req)
	}
	if node.Outcome != "Error" || !strings.Contains(node.Error, "CEL runtime error") {
		t.Fatalf("node = %+v", node)
	}
}

// Every device is allocated: the DRA test driver's only device serves a running pod; the
// second pod pends and explain names the claim that holds the device and its pod.
func TestExplainAllDevicesAllocated(t *testing.T) {
	n := startNode(t, "ex-allocated")
	startTestDriver(t, n, 1)
	ns := namespace(t, "ex-allocated")
	deviceClass(t, "ex-allocated")
	createTemplate(t, ns, "one", claimSpec("ex-allocated"))
	waitingPod(t, ns, "first", n.name, "one", "", false)
	waitForPodRunning(t, ns, "first")
	waitingPod(t, ns, "second", n.name, "one", "", false)
	waitUnschedulable(t, ns, "second")
	r := explainPod(t, ns, "pod/second")
	node := r.Nodes[onlyNode(t, r)]
	req := node.Explanation.Requests[0]
	if req.InUse != 1 || req.Usable != 0 || !strings.Contains(req.Verdict, "1 allocated to other claims") {
		t.Fatalf("request = %+v", req)
	}
	if len(node.InUseBy) != 1 || len(node.InUseBy[0].HeldBy) != 1 ||
		!strings.HasPrefix(node.InUseBy[0].HeldBy[0], ns+"/first-gpu-") ||
		!strings.HasSuffix(node.InUseBy[0].HeldBy[0], "(reserved for pods/first)") {
		t.Fatalf("in use by = %+v", node.InUseBy)
	}
	// The first pod's claim: allocated, where and for whom.
	first := explainPod(t, ns, "pod/first")
	if len(first.Claims) != 1 || first.Claims[0].State != "Allocated" || first.Claims[0].AllocatedOn != n.name ||
		len(first.Claims[0].ReservedFor) != 1 || first.Claims[0].ReservedFor[0] != "pods/first" {
		t.Fatalf("first pod's claims = %+v", first.Claims)
	}
	claim := strings.TrimPrefix(strings.Fields(node.InUseBy[0].HeldBy[0])[0], ns+"/")
	byClaim := explainPod(t, ns, "claim/"+claim)
	if !strings.HasPrefix(byClaim.Summary, "allocated on "+n.name+"; reserved for pods/first") {
		t.Fatalf("claim summary = %q", byClaim.Summary)
	}
}

// Device taints in the slice (and a DeviceTaintRule, when the API server serves them) that the
// request does not tolerate.
func TestExplainTaintsNotTolerated(t *testing.T) {
	const driver = "taint.explain.example.com"
	n := startNode(t, "ex-taints")
	ns := namespace(t, "ex-taints")
	driverClass(t, "ex-taints", driver)
	tainted := gpuDevice("gpu-0", "a100", 0)
	tainted.Taints = []resourcev1.DeviceTaint{{Key: "example.com/broken", Value: "yes", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	createSlice(t, "ex-taints", n.name, driver, 1, 1, tainted, gpuDevice("gpu-1", "a100", 1))
	rule := &resourcev1beta2.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: "ex-taints"},
		Spec: resourcev1beta2.DeviceTaintRuleSpec{
			DeviceSelector: &resourcev1beta2.DeviceTaintSelector{Driver: ptr.To(driver), Pool: ptr.To(n.name), Device: ptr.To("gpu-1")},
			Taint:          resourcev1beta2.DeviceTaint{Key: "example.com/maintenance", Effect: resourcev1beta2.DeviceTaintEffectNoSchedule},
		},
	}
	_, err := controlPlane.admin.ResourceV1beta2().DeviceTaintRules().Create(ctx(t), rule, metav1.CreateOptions{})
	ruleServed := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("create DeviceTaintRule: %v", err)
	}
	if ruleServed {
		t.Cleanup(func() {
			_ = controlPlane.admin.ResourceV1beta2().DeviceTaintRules().Delete(context.Background(), "ex-taints", metav1.DeleteOptions{})
		})
	} else {
		t.Logf("DeviceTaintRules are not served; tainting gpu-1 in the slice instead")
		// Count 2 devices both tainted so the pod pends either way.
		_ = controlPlane.admin.ResourceV1().ResourceSlices().Delete(ctx(t), "ex-taints", metav1.DeleteOptions{})
		other := gpuDevice("gpu-1", "a100", 1)
		other.Taints = []resourcev1.DeviceTaint{{Key: "example.com/maintenance", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
		createSlice(t, "ex-taints-2", n.name, driver, 1, 1, tainted, other)
	}
	createClaim(t, ns, "c", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-taints", 1)},
	}})
	waitingPod(t, ns, "pending", n.name, "", "c", false)
	waitUnschedulable(t, ns, "pending")
	r := explainPod(t, ns, "pod/pending")
	req := r.Nodes[onlyNode(t, r)].Explanation.Requests[0]
	if req.Tainted != 2 || req.Usable != 0 {
		t.Fatalf("request = %+v", req)
	}
	if !contains(req.UntoleratedTaints, "example.com/broken=yes:NoSchedule") || !contains(req.UntoleratedTaints, "example.com/maintenance:NoSchedule") {
		t.Fatalf("untolerated taints = %v", req.UntoleratedTaints)
	}
}

// Two requests that must share a NUMA node, on devices that are on different ones.
func TestExplainMatchAttributeUnsatisfiable(t *testing.T) {
	const driver = "match.explain.example.com"
	n := startNode(t, "ex-match")
	ns := namespace(t, "ex-match")
	driverClass(t, "ex-match", driver)
	createSlice(t, "ex-match", n.name, driver, 1, 1, gpuDevice("gpu-0", "a100", 0), gpuDevice("gpu-1", "a100", 1))
	createClaim(t, ns, "pair", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("a", "ex-match", 1), request("b", "ex-match", 1)},
		Constraints: []resourcev1.DeviceConstraint{{
			Requests:       []string{"a", "b"},
			MatchAttribute: ptr.To(resourcev1.FullyQualifiedName(driver + "/numa")),
		}},
	}})
	waitingPod(t, ns, "pending", n.name, "", "pair", false)
	waitUnschedulable(t, ns, "pending")
	r := explainPod(t, ns, "pod/pending")
	ex := r.Nodes[onlyNode(t, r)].Explanation
	if len(ex.Constraints) != 1 || !strings.HasPrefix(ex.Constraints[0].Verdict, "no value is shared by 2 usable devices") {
		t.Fatalf("constraints = %+v", ex.Constraints)
	}
	if !strings.Contains(r.Summary, "matchAttribute "+driver+"/numa") {
		t.Fatalf("summary = %q", r.Summary)
	}
}

// A pool whose newest generation is incomplete (one of two slices published) while an older
// generation's slice is still there: no usable pool.
func TestExplainIncompletePoolOutdatedGeneration(t *testing.T) {
	const driver = "gen.explain.example.com"
	n := startNode(t, "ex-gen")
	ns := namespace(t, "ex-gen")
	driverClass(t, "ex-gen", driver)
	createSlice(t, "ex-gen-old", n.name, driver, 1, 1, gpuDevice("gpu-0", "a100", 0))
	createSlice(t, "ex-gen-new", n.name, driver, 2, 2, gpuDevice("gpu-1", "a100", 0))
	createClaim(t, ns, "c", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-gen", 1)},
	}})
	waitingPod(t, ns, "pending", n.name, "", "c", false)
	waitUnschedulable(t, ns, "pending")
	r := explainPod(t, ns, "pod/pending")
	node := r.Nodes[onlyNode(t, r)]
	if len(node.Explanation.IncompletePools) != 1 {
		t.Fatalf("explanation = %+v", node.Explanation)
	}
	if !contains(node.Notes, "generation 2 has 1 of 2 ResourceSlices; 1 ResourceSlice(s) of older generations are outdated") {
		t.Fatalf("notes = %v", node.Notes)
	}
}

// A pod that fits waits behind a scheduling gate: explain says allocatable with the devices;
// a snapshot of the namespace (with a second pod that cannot fit) replays with `devicelet
// allocate` to the same decisions; once the gate is removed kube-scheduler allocates exactly
// the devices explain named.
func TestExplainAllocatableAndSnapshotReplay(t *testing.T) {
	const driver = "fit.explain.example.com"
	n := startNode(t, "ex-fit")
	ns := namespace(t, "ex-fit")
	driverClass(t, "ex-fit", driver)
	createSlice(t, "ex-fit", n.name, driver, 1, 1, gpuDevice("gpu-0", "a100", 0), gpuDevice("gpu-1", "h100", 1))
	createClaim(t, ns, "h100", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-fit", 1, `device.attributes["`+driver+`"].model == "h100"`)},
	}})
	createClaim(t, ns, "three", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-fit", 3)},
	}})
	waitingPod(t, ns, "fits", n.name, "", "h100", true)
	waitingPod(t, ns, "toobig", n.name, "", "three", false)
	waitUnschedulable(t, ns, "toobig")

	r := explainPod(t, ns, "pod/fits")
	if len(r.Nodes) != 1 || r.Nodes[0].Outcome != "Allocated" || len(r.Nodes[0].Devices) != 1 {
		t.Fatalf("nodes = %+v", r.Nodes)
	}
	predicted := r.Nodes[0].Devices[0].Device
	if predicted != driver+"/"+n.name+"/gpu-1" || !strings.HasPrefix(r.Summary, "allocatable on 1 of 1") {
		t.Fatalf("predicted %s, summary %q", predicted, r.Summary)
	}
	big := explainPod(t, ns, "pod/toobig")
	if big.Nodes[onlyNode(t, big)].Explanation.Requests[0].Verdict != "needs 3 device(s), only 2 usable" {
		t.Fatalf("toobig = %+v", big.Nodes[0].Explanation.Requests[0])
	}

	// The snapshot replays offline to the same decisions.
	file := filepath.Join(shortTempDir(t), "scenario.yaml")
	devicelet(t, "snapshot", "-n", ns, "--kubeconfig", adminKubeconfig(), "--redact-config", "-o", file)
	want := map[string]string{
		ns + "/fits":   "Allocated " + n.name + " " + predicted,
		ns + "/toobig": "Unschedulable",
	}
	replayed := replayDecisions(t, devicelet(t, "allocate", "-f", file, "-o", "json"))
	if fmt.Sprint(replayed) != fmt.Sprint(want) {
		text, _ := os.ReadFile(file)
		t.Fatalf("devicelet allocate replayed %v, want %v\nscenario:\n%s", replayed, want, text)
	}
	// And the Go oracle (the upstream structured allocator, interop/allocator) agrees.
	oracle := filepath.Join(shortTempDir(t), "oracle")
	build := exec.Command("go", "build", "-o", oracle, "./cmd/oracle")
	build.Dir = filepath.Join("..", "allocator")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the Go oracle: %v\n%s", err, out)
	}
	out, err := exec.Command(oracle, "-f", file, "-o", "json").Output()
	if err != nil {
		t.Fatalf("Go oracle on the snapshot: %v", err)
	}
	if got := replayDecisions(t, string(out)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the Go oracle replayed %v, want %v", got, want)
	}

	// The scheduler agrees. There is no driver, so devicelet refuses the bound pod and the
	// claim is deallocated soon after: watch for the allocation instead of polling.
	watchCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Watch(watchCtx, metav1.ListOptions{FieldSelector: "metadata.name=h100"})
	if err != nil {
		t.Fatalf("watch claim h100: %v", err)
	}
	defer w.Stop()
	pod, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "fits", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.SchedulingGates = nil
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Update(ctx(t), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("remove the scheduling gate: %v", err)
	}
	for ev := range w.ResultChan() {
		c, ok := ev.Object.(*resourcev1.ResourceClaim)
		if !ok || c.Status.Allocation == nil {
			continue
		}
		res := c.Status.Allocation.Devices.Results
		if len(res) != 1 || res[0].Driver+"/"+res[0].Pool+"/"+res[0].Device != predicted {
			t.Fatalf("kube-scheduler allocated %+v, explain predicted %s", res, predicted)
		}
		t.Logf("kube-scheduler allocated %s, as explained", predicted)
		return
	}
	t.Fatalf("claim h100 was not allocated within 60 s of removing the scheduling gate")
}

// Shared counters exhausted (partitionable devices): two partitions consume 3 of the pool's 4
// units each; a claim allocated by hand (no consumer, so kube-controller-manager leaves it)
// holds one partition, the other no longer fits the counters that are left.
func TestExplainCountersExhausted(t *testing.T) {
	const driver = "counters.explain.example.com"
	n := startNode(t, "ex-counters")
	ns := namespace(t, "ex-counters")
	driverClass(t, "ex-counters", driver)
	counters := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "ex-counters-set"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To(n.name),
			Pool: resourcev1.ResourcePool{Name: n.name, Generation: 1, ResourceSliceCount: 2},
			SharedCounters: []resourcev1.CounterSet{{
				Name:     "memory",
				Counters: map[string]resourcev1.Counter{"units": {Value: resource.MustParse("4")}},
			}},
		},
	}
	if _, err := controlPlane.admin.ResourceV1().ResourceSlices().Create(ctx(t), counters, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the counter slice: %v", err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.ResourceV1().ResourceSlices().Delete(context.Background(), "ex-counters-set", metav1.DeleteOptions{})
	})
	partition := func(name string) resourcev1.Device {
		d := gpuDevice(name, "a100", 0)
		d.ConsumesCounters = []resourcev1.DeviceCounterConsumption{{
			CounterSet: "memory",
			Counters:   map[string]resourcev1.Counter{"units": {Value: resource.MustParse("3")}},
		}}
		return d
	}
	devices := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "ex-counters-devices"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To(n.name),
			Pool:    resourcev1.ResourcePool{Name: n.name, Generation: 1, ResourceSliceCount: 2},
			Devices: []resourcev1.Device{partition("part-0"), partition("part-1")},
		},
	}
	created, err := controlPlane.admin.ResourceV1().ResourceSlices().Create(ctx(t), devices, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the device slice: %v", err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.ResourceV1().ResourceSlices().Delete(context.Background(), "ex-counters-devices", metav1.DeleteOptions{})
	})
	if len(created.Spec.Devices[0].ConsumesCounters) == 0 {
		t.Skip("the API server dropped consumesCounters (DRAPartitionableDevices off)")
	}
	// The holder: allocated by hand to part-0.
	spec := resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-counters", 1)},
	}}
	createClaim(t, ns, "hog", spec)
	hog, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), "hog", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hog.Status.Allocation = &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: driver, Pool: n.name, Device: "part-0",
		}}},
	}
	if _, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx(t), hog, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate claim hog by hand: %v", err)
	}
	createClaim(t, ns, "c", spec)
	waitingPod(t, ns, "pending", n.name, "", "c", false)
	waitUnschedulable(t, ns, "pending")
	r := explainPod(t, ns, "pod/pending")
	node := r.Nodes[onlyNode(t, r)]
	req := node.Explanation.Requests[0]
	if req.InUse != 1 || req.Usable != 0 || !strings.Contains(req.Verdict, "1 out of shared counters") {
		t.Fatalf("request = %+v", req)
	}
	if len(node.InUseBy) != 1 || len(node.InUseBy[0].HeldBy) != 1 || node.InUseBy[0].HeldBy[0] != ns+"/hog (reserved for nobody)" {
		t.Fatalf("in use by = %+v", node.InUseBy)
	}
}

// replayDecisions reads an AllocationOutcome (schedule mode) as pod -> "Allocated NODE
// DRIVER/POOL/DEVICE" or its outcome.
func replayDecisions(t *testing.T, out string) map[string]string {
	t.Helper()
	var outcome struct {
		Pods []struct {
			Pod     string `json:"pod"`
			Node    string `json:"node"`
			Outcome string `json:"outcome"`
			Results []struct {
				Devices struct {
					Results []struct{ Driver, Pool, Device string } `json:"results"`
				} `json:"devices"`
			} `json:"results"`
		} `json:"pods"`
	}
	if err := json.Unmarshal([]byte(out), &outcome); err != nil {
		t.Fatalf("allocation outcome %q: %v", out, err)
	}
	decisions := map[string]string{}
	for _, p := range outcome.Pods {
		d := p.Outcome
		if p.Outcome == "Allocated" && len(p.Results) > 0 && len(p.Results[0].Devices.Results) > 0 {
			res := p.Results[0].Devices.Results[0]
			d = fmt.Sprintf("Allocated %s %s/%s/%s", p.Node, res.Driver, res.Pool, res.Device)
		}
		decisions[p.Pod] = d
	}
	return decisions
}

// Explain at cluster size: N nodes (default 500, CLUSTER_EXPLAIN_NODES), each with a
// ResourceSlice of 8 GPUs, and a pod whose claim fits none of them. `devicelet explain` reads
// everything through the API server and explains every node; the test reports the wall time
// (the goal is under 1 s with a release build: CLUSTER_EXPLAIN_BUDGET_MS=1000 enforces it).
func TestExplainAtClusterSize(t *testing.T) {
	const driver = "big.explain.example.com"
	nodes := envInt("CLUSTER_EXPLAIN_NODES", 500)
	ns := namespace(t, "ex-big")
	driverClass(t, "ex-big", driver)
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("ex-big-%03d", i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
		if _, err := controlPlane.admin.CoreV1().Nodes().Create(ctx(t), node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		t.Cleanup(func() {
			_ = controlPlane.admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		var devices []resourcev1.Device
		for d := 0; d < 8; d++ {
			devices = append(devices, gpuDevice(fmt.Sprintf("gpu-%d", d), "a100", int64(d/4)))
		}
		createSlice(t, name, name, driver, 1, 1, devices...)
	}
	createClaim(t, ns, "h100", resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
		Requests: []resourcev1.DeviceRequest{request("gpu", "ex-big", 1, `device.attributes["`+driver+`"].model == "h100"`)},
	}})
	waitingPod(t, ns, "wants-h100", "", "", "h100", true)

	started := time.Now()
	out := devicelet(t, "explain", "pod/wants-h100", "-n", ns, "--kubeconfig", adminKubeconfig(), "-o", "json")
	elapsed := time.Since(started)
	var r explainReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("explain output: %v", err)
	}
	explained := 0
	for _, node := range r.Nodes {
		if strings.HasPrefix(node.Node, "ex-big-") {
			explained++
		}
	}
	if explained != nodes {
		t.Fatalf("explained %d of the %d nodes; summary %q", explained, nodes, r.Summary)
	}
	t.Logf("EXPLAIN nodes=%d slices=%d devices=%d: devicelet explain (API reads, conversion, allocator on every node) took %s",
		nodes, nodes, nodes*8, elapsed.Round(time.Millisecond))
	if budget := envInt("CLUSTER_EXPLAIN_BUDGET_MS", 0); budget > 0 && elapsed > time.Duration(budget)*time.Millisecond {
		t.Fatalf("explain took %s, over the %d ms budget", elapsed, budget)
	}
}
