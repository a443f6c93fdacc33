// Package workloads builds the scheduler_perf-shaped DRA workloads of spec
// structured-allocator.md §4.4-§4.5 (test/integration/scheduler_perf/dra, scheduler_perf/dra.go) as
// AllocationScenarios, so that the Go allocator (cmd/gobench) and devicelet's Rust benchmark run
// identical inputs. Names and shapes match devicelet-allocator's `workloads` module.
//
// Common shape: one slice per node (name = pool = node name, nodeName set, count 1, generation 0)
// of devices `instance-<i>` with attributes model="A100", family="GPU", driverVersion=1.2.3
// (version), dra.example.com/numa=<i> and capacity memory=1Gi; class `test-class` selects
// `device.driver == "test-driver.cdi.k8s.io"`; the claim has one request `req-0`, ExactCount 1.
package workloads

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"devicelet.invalid/interop/allocator/harness"
)

// Driver is scheduler_perf's driver name.
const Driver = "test-driver.cdi.k8s.io"

// Kind says how a workload is measured.
type Kind int

const (
	// PerPod: one unit = a new allocator plus Allocate on every node (PreFilter + Filter).
	PerPod Kind = iota
	// FillUp: one unit = one pod of mode: schedule placed on the first node that fits.
	FillUp
)

// Workload is one benchmark input.
type Workload struct {
	Name     string
	Kind     Kind
	Scenario *harness.Scenario
	// WantFit is the number of nodes that must fit (PerPod) or pods that must be placed (FillUp);
	// -1 = at least one.
	WantFit int
}

func base(name string) *harness.Scenario {
	return &harness.Scenario{
		APIVersion:       harness.APIVersion,
		Kind:             "AllocationScenario",
		Name:             name,
		Semantics:        harness.Semantics{Variant: "incubating", Compat: "k8s-v1.36.1"},
		Features:         harness.AllIncubatingFeatures,
		CEL:              &harness.CELOptions{EnableConsumableCapacity: true},
		Mode:             "allocate",
		DeviceClasses:    []resourceapi.DeviceClass{class("test-class", `device.driver == "test-driver.cdi.k8s.io"`)},
		ApplyAPIDefaults: ptr.To(true),
	}
}

func class(name string, selectors ...string) resourceapi.DeviceClass {
	c := resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, e := range selectors {
		c.Spec.Selectors = append(c.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	return c
}

func node(name string) v1.Node { return v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

// Claim is a claim with one ExactCount request per (name, class, count).
func claim(name string, count int64, class string, constraints ...resourceapi.DeviceConstraint) resourceapi.ResourceClaim {
	return resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "req-0", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
			}}},
			Constraints: constraints,
		}},
	}
}

func perfDevice(i int) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("instance-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"model":                {StringValue: ptr.To("A100")},
			"family":               {StringValue: ptr.To("GPU")},
			"driverVersion":        {VersionValue: ptr.To("1.2.3")},
			"dra.example.com/numa": {IntValue: ptr.To(int64(i))},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("1Gi")}},
	}
}

func nodeSlice(nodeName string, devices int) resourceapi.ResourceSlice {
	s := resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   Driver,
			NodeName: ptr.To(nodeName),
			Pool:     resourceapi.ResourcePool{Name: nodeName, Generation: 0, ResourceSliceCount: 1},
		},
	}
	for i := 0; i < devices; i++ {
		s.Spec.Devices = append(s.Spec.Devices, perfDevice(i))
	}
	return s
}

// SteadyState is §4.5.1: nodes × devices node-local devices, allocatedPermille of them allocated
// (device index by device index across all nodes), one pod with one single-device claim
// (scheduler_perf SteadyStateClusterResourceClaimTemplate empty/half/full).
func SteadyState(nodes, devices, allocatedPermille int, selectors ...string) Workload {
	name := fmt.Sprintf("steady_%dx%d_%dpermille", nodes, devices, allocatedPermille)
	s := base(name)
	if len(selectors) > 0 {
		s.DeviceClasses = []resourceapi.DeviceClass{class("test-class", selectors...)}
	}
	for n := 0; n < nodes; n++ {
		name := fmt.Sprintf("node-%d", n)
		s.Nodes = append(s.Nodes, node(name))
		s.ResourceSlices = append(s.ResourceSlices, nodeSlice(name, devices))
	}
	toAllocate := nodes * devices * allocatedPermille / 1000
	st := &harness.State{}
outer:
	for d := 0; d < devices; d++ {
		for n := 0; n < nodes; n++ {
			if len(st.Devices) >= toAllocate {
				break outer
			}
			st.Devices = append(st.Devices, harness.StateDevice{Driver: Driver, Pool: fmt.Sprintf("node-%d", n), Device: fmt.Sprintf("instance-%d", d)})
		}
	}
	if len(st.Devices) > 0 {
		s.Allocated = &harness.Allocated{State: st}
	}
	s.Claims = []resourceapi.ResourceClaim{claim("claim-0", 1, "test-class")}
	want := nodes
	if toAllocate > 0 {
		want = -1
	}
	return Workload{Name: name, Kind: PerPod, Scenario: s, WantFit: want}
}

// CELHeavySelectors is the §4.5.6 class: a 10-clause selector, exists_one over the attributes and
// a regex match.
var CELHeavySelectors = []string{
	`device.driver == "test-driver.cdi.k8s.io" && device.attributes["test-driver.cdi.k8s.io"].model == "A100" && device.attributes["test-driver.cdi.k8s.io"].family == "GPU" && device.attributes["dra.example.com"].numa >= 0 && device.attributes["dra.example.com"].numa < 1000 && device.capacity["test-driver.cdi.k8s.io"].memory.compareTo(quantity("1Gi")) >= 0 && "model" in device.attributes["test-driver.cdi.k8s.io"] && device.driver.startsWith("test-") && device.driver.endsWith(".io") && size(device.attributes) >= 1`,
	`device.attributes["test-driver.cdi.k8s.io"].exists_one(k, k == "model")`,
	`device.attributes["test-driver.cdi.k8s.io"].model.matches("^A[0-9]+$")`,
}

// CELHeavy is §4.5.6 on the empty steady state.
func CELHeavy(nodes, devices int) Workload {
	w := SteadyState(nodes, devices, 0, CELHeavySelectors...)
	w.Name = fmt.Sprintf("cel_heavy_%dx%d", nodes, devices)
	w.Scenario.Name = w.Name
	return w
}

// FillUpPods is §4.5.2: pods single-device pods (one claim each) scheduled one after the other
// onto nodes × devices (scheduler_perf SchedulingWithResourceClaimTemplate/5000pods_500nodes).
func FillUpPods(pods, nodes, devices int) Workload {
	w := SteadyState(nodes, devices, 0)
	w.Name = fmt.Sprintf("fill_up_%dpods_%dnodes", pods, nodes)
	s := w.Scenario
	s.Name = w.Name
	s.Mode = "schedule"
	s.FirstFit = true
	s.Claims = nil
	for p := 0; p < pods; p++ {
		c := fmt.Sprintf("claim-%d", p)
		s.Claims = append(s.Claims, claim(c, 1, "test-class"))
		s.Pods = append(s.Pods, harness.Pod{Name: fmt.Sprintf("pod-%d", p), Claims: []string{c}})
	}
	w.Kind = FillUp
	w.WantFit = min(pods, nodes*devices)
	return w
}

// Partitionable is §4.5.3: pools network-attached partitionable pools visible from every node,
// each one counter slice (counter set "set", units=6) and one slice of 6 partitions consuming
// 1..3 units with attribute dra.example.com/slice = i/3; the claim asks for 2 devices with
// matchAttribute dra.example.com/slice (scheduler_perf Partitionable).
func Partitionable(nodes, pools int) Workload {
	name := fmt.Sprintf("partitionable_%dpools_%dnodes", pools, nodes)
	s := base(name)
	for n := 0; n < nodes; n++ {
		s.Nodes = append(s.Nodes, node(fmt.Sprintf("node-%d", n)))
	}
	for p := 0; p < pools; p++ {
		pool := fmt.Sprintf("pool-%d", p)
		s.ResourceSlices = append(s.ResourceSlices, resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: pool + "-counters"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: Driver, AllNodes: ptr.To(true),
				Pool:           resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 2},
				SharedCounters: []resourceapi.CounterSet{{Name: "set", Counters: map[string]resourceapi.Counter{"units": {Value: resource.MustParse("6")}}}},
			},
		})
		devs := resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: pool + "-devices"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: Driver, AllNodes: ptr.To(true),
				Pool: resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 2},
			},
		}
		for i := 0; i < 6; i++ {
			d := perfDevice(i)
			d.Attributes["dra.example.com/slice"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i / 3))}
			d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{
				CounterSet: "set",
				Counters:   map[string]resourceapi.Counter{"units": {Value: resource.MustParse(fmt.Sprint(1 + i%3))}},
			}}
			devs.Spec.Devices = append(devs.Spec.Devices, d)
		}
		s.ResourceSlices = append(s.ResourceSlices, devs)
	}
	match := resourceapi.FullyQualifiedName("dra.example.com/slice")
	s.Claims = []resourceapi.ResourceClaim{claim("claim-0", 2, "test-class", resourceapi.DeviceConstraint{MatchAttribute: &match})}
	return Workload{Name: name, Kind: PerPod, Scenario: s, WantFit: nodes}
}

// Backtracking is §4.5.4 (scheduler_perf PartitionableBacktracking): one pool of 8 devices, each
// consuming its own cpu counter and memory (20Gi for device-1, 10Gi for the rest) from 70Gi; the
// pod asks for count devices (7 needs a backtrack, 8 cannot fit).
func Backtracking(count int) Workload {
	name := fmt.Sprintf("backtracking_count%d", count)
	s := base(name)
	s.Nodes = []v1.Node{node("node-0")}
	counters := map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("70Gi")}}
	for i := 0; i < 8; i++ {
		counters[fmt.Sprintf("cpu-%d", i)] = resourceapi.Counter{Value: resource.MustParse("1")}
	}
	devs := resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "devices"},
		Spec:       resourceapi.ResourceSliceSpec{Driver: Driver, NodeName: ptr.To("node-0"), Pool: resourceapi.ResourcePool{Name: "pool", ResourceSliceCount: 2}},
	}
	for i := 0; i < 8; i++ {
		mem := "10Gi"
		if i == 0 {
			mem = "20Gi"
		}
		devs.Spec.Devices = append(devs.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("device-%d", i+1),
			ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "set", Counters: map[string]resourceapi.Counter{
				"memory": {Value: resource.MustParse(mem)}, fmt.Sprintf("cpu-%d", i): {Value: resource.MustParse("1")},
			}}},
		})
	}
	s.ResourceSlices = []resourceapi.ResourceSlice{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "counters"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: Driver, NodeName: ptr.To("node-0"), Pool: resourceapi.ResourcePool{Name: "pool", ResourceSliceCount: 2},
				SharedCounters: []resourceapi.CounterSet{{Name: "set", Counters: counters}},
			},
		},
		devs,
	}
	s.Claims = []resourceapi.ResourceClaim{claim("claim-0", int64(count), "test-class")}
	want := 1
	if count > 7 {
		want = 0
	}
	return Workload{Name: name, Kind: PerPod, Scenario: s, WantFit: want}
}

// Consumable is §4.5.5 (scheduler_perf ConsumableCapacity): nodes with 20 driver devices each
// (excluded by the class) plus shareable network devices (memory 80Gi, policy default 1Gi, min
// 1Gi, allNodes); the pod asks for 2 requests × 40Gi.
func Consumable(nodes, shareable int) Workload {
	name := fmt.Sprintf("consumable_%ddevices_%dnodes", shareable, nodes)
	s := base(name)
	s.DeviceClasses = []resourceapi.DeviceClass{class("network-class", `device.driver == "network.example.com"`)}
	for n := 0; n < nodes; n++ {
		nn := fmt.Sprintf("node-%d", n)
		s.Nodes = append(s.Nodes, node(nn))
		s.ResourceSlices = append(s.ResourceSlices, nodeSlice(nn, 20))
	}
	net := resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "network"},
		Spec:       resourceapi.ResourceSliceSpec{Driver: "network.example.com", AllNodes: ptr.To(true), Pool: resourceapi.ResourcePool{Name: "network", ResourceSliceCount: 1}},
	}
	for i := 0; i < shareable; i++ {
		net.Spec.Devices = append(net.Spec.Devices, resourceapi.Device{
			Name:                     fmt.Sprintf("nic-%d", i),
			AllowMultipleAllocations: ptr.To(true),
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {
				Value: resource.MustParse("80Gi"),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    ptr.To(resource.MustParse("1Gi")),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Gi"))},
				},
			}},
		})
	}
	// The API caps a slice at 128 devices; split the network pool accordingly.
	for start, part := 0, 0; start < len(net.Spec.Devices); start, part = start+128, part+1 {
		end := min(start+128, len(net.Spec.Devices))
		sl := *net.DeepCopy()
		sl.Name = fmt.Sprintf("network-%d", part)
		sl.Spec.Devices = sl.Spec.Devices[start:end]
		sl.Spec.Pool.ResourceSliceCount = int64((len(net.Spec.Devices) + 127) / 128)
		s.ResourceSlices = append(s.ResourceSlices, sl)
	}
	req := func(name string) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: "network-class", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("40Gi")}},
		}}
	}
	s.Claims = []resourceapi.ResourceClaim{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "claim-0"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req("req-0"), req("req-1")}}},
	}}
	return Workload{Name: name, Kind: PerPod, Scenario: s, WantFit: nodes}
}

// All returns the §4.4-§4.5 workload set.
func All() []Workload {
	return []Workload{
		SteadyState(500, 10, 0),
		SteadyState(500, 10, 500),
		SteadyState(500, 10, 998),
		FillUpPods(5000, 500, 10),
		Partitionable(10, 200),
		Partitionable(100, 2000),
		CELHeavy(500, 10),
		Backtracking(5),
		Backtracking(6),
		Backtracking(7),
		Backtracking(8),
		Consumable(100, 2000),
	}
}
