package scheduler

// DRA in the cases (about 30 % of them): one driver, gpu.example.com, whose ResourceSlices
// publish 0-4 devices on some nodes (a `model` string attribute, a `memory` capacity), a
// DeviceClass selecting the driver by CEL and sometimes a second one selecting the big devices,
// claims of bound pods already allocated on their node (so nodes fill up and preemption is
// tried), and 1-2 pre-created, unallocated claims of the pod to schedule: exactly 1-2 devices,
// sometimes with a CEL selector, sometimes allocationMode All, sometimes a firstAvailable
// prioritized list (what DynamicResources scores), sometimes naming a class that does not exist.
//
// The objects are as the API server stores them: defaulted requests (allocationMode ExactCount,
// count), claims with a uid, a namespace and a resourceVersion, slices of one pool per node
// (pool name = node name, generation 1, resourceSliceCount 1, spec.nodeName), allocations as
// the scheduler writes them (one result per device with driver, pool, device and request; the
// node selector `matchFields metadata.name In [node]`), status.reservedFor naming the bound pod.
// Left out: templates (devicelet offline has no template controller), shared counters,
// consumable capacity, admin access, device taints, binding conditions, extended resources
// backed by a class.

import (
	"fmt"
	"math/rand"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

const (
	gpuDriver = "gpu.example.com"
	// gpuClass selects every device of the driver; bigGPUClass only those with 40Gi or more
	// (and is sometimes missing from the case: a claim naming it waits for it).
	gpuClass    = "gpu.example.com"
	bigGPUClass = "big.gpu.example.com"
)

var (
	gpuModels   = []string{"a100", "h100", "l4"}
	gpuMemories = []string{"16Gi", "40Gi", "80Gi"}
	// gpuSelectors are the CEL selectors requests draw from.
	gpuSelectors = []string{
		`device.attributes["gpu.example.com"].model == "h100"`,
		`device.attributes["gpu.example.com"].model in ["a100", "h100"]`,
		`device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0`,
		`device.attributes["gpu.example.com"].model != "l4" && device.capacity["gpu.example.com"].memory.compareTo(quantity("80Gi")) < 0`,
	}
)

func celSelectors(exprs ...string) []resourceapi.DeviceSelector {
	var out []resourceapi.DeviceSelector
	for _, e := range exprs {
		out = append(out, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	return out
}

func genDeviceClass(name, expr string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("class-" + name), ResourceVersion: "1", Generation: 1},
		Spec:       resourceapi.DeviceClassSpec{Selectors: celSelectors(expr)},
	}
}

// genSlice publishes n devices on a node, in one pool named after it.
func genSlice(r *rand.Rand, node string, n int) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Name: node + "-" + gpuDriver, UID: types.UID("slice-" + node), ResourceVersion: "1", Generation: 1,
		},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   gpuDriver,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
		},
	}
	// Often one model per node, sometimes a mix.
	model, memory := pick(r, gpuModels...), pick(r, gpuMemories...)
	mixed := chance(r, 3)
	for i := 0; i < n; i++ {
		if mixed {
			model, memory = pick(r, gpuModels...), pick(r, gpuMemories...)
		}
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"model": {StringValue: ptr.To(model)},
				"index": {IntValue: ptr.To(int64(i))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: quantity(memory)},
			},
		})
	}
	return s
}

// genDRA adds DRA to about 30 % of the cases. It runs after everything else is drawn, so a
// seed's case without DRA is the same as before DRA existed.
func genDRA(r *rand.Rand, c *Case, nextUID func() types.UID) {
	if r.Intn(10) >= 3 {
		return
	}
	c.DeviceClasses = []*resourceapi.DeviceClass{genDeviceClass(gpuClass, `device.driver == "gpu.example.com"`)}
	if !chance(r, 4) {
		c.DeviceClasses = append(c.DeviceClasses, genDeviceClass(bigGPUClass,
			`device.driver == "gpu.example.com" && device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0`))
	}
	free := map[string][]string{} // node -> devices not allocated yet
	for _, n := range c.Nodes {
		if chance(r, 5) {
			continue // no slice at all
		}
		s := genSlice(r, n.Name, r.Intn(5))
		c.ResourceSlices = append(c.ResourceSlices, s)
		for _, d := range s.Spec.Devices {
			free[n.Name] = append(free[n.Name], d.Name)
		}
	}
	// Bound pods with claims allocated on their node.
	for _, p := range c.Pods {
		devs := free[p.Spec.NodeName]
		if len(devs) == 0 || chance(r, 3) {
			continue
		}
		k := 1
		if len(devs) > 1 && chance(r, 3) {
			k = 2
		}
		r.Shuffle(len(devs), func(i, j int) { devs[i], devs[j] = devs[j], devs[i] })
		taken := devs[:k]
		free[p.Spec.NodeName] = devs[k:]
		claim := &resourceapi.ResourceClaim{
			TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
			ObjectMeta: metav1.ObjectMeta{
				Name: p.Name + "-gpu", Namespace: p.Namespace, UID: nextUID(), ResourceVersion: "2",
				CreationTimestamp: p.CreationTimestamp,
			},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu",
				Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: gpuClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(k),
				},
			}}}},
			Status: resourceapi.ResourceClaimStatus{
				Allocation: &resourceapi.AllocationResult{NodeSelector: nodeNameSelector(p.Spec.NodeName)},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{
					Resource: "pods", Name: p.Name, UID: p.UID,
				}},
			},
		}
		for _, d := range taken {
			claim.Status.Allocation.Devices.Results = append(claim.Status.Allocation.Devices.Results,
				resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: gpuDriver, Pool: p.Spec.NodeName, Device: d})
		}
		c.ResourceClaims = append(c.ResourceClaims, claim)
		usesClaim(p, "gpu", claim.Name)
	}
	// The pod to schedule: 1-2 claims, each of 1-2 requests.
	nClaims := 1
	if chance(r, 5) {
		nClaims = 2
	}
	for i := 0; i < nClaims; i++ {
		claim := &resourceapi.ResourceClaim{
			TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("%s-gpu-%d", c.Pod.Name, i), Namespace: c.Pod.Namespace, UID: nextUID(), ResourceVersion: "1",
				CreationTimestamp: c.Pod.CreationTimestamp,
			},
		}
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, genDeviceRequest(r, "gpu"))
		if chance(r, 6) {
			claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, genDeviceRequest(r, "extra"))
		}
		c.ResourceClaims = append(c.ResourceClaims, claim)
		usesClaim(c.Pod, fmt.Sprintf("gpu%d", i), claim.Name)
	}
}

// nodeNameSelector is the node selector the scheduler writes into an allocation of devices
// local to a node.
func nodeNameSelector(node string) *v1.NodeSelector {
	return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
}

// usesClaim lists the claim in the pod's spec.resourceClaims and gives it to its first container.
func usesClaim(p *v1.Pod, podClaim, claimName string) {
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: podClaim, ResourceClaimName: ptr.To(claimName)})
	p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, v1.ResourceClaim{Name: podClaim})
}

// deviceClassFor is usually the driver's class, sometimes the big devices' one (which the case
// may lack).
func deviceClassFor(r *rand.Rand) string {
	if chance(r, 4) {
		return bigGPUClass
	}
	return gpuClass
}

func exactCount(r *rand.Rand) int64 {
	if chance(r, 4) {
		return 2
	}
	return 1
}

// genDeviceRequest draws one request: exactly 1-2 devices (sometimes with a selector), all of
// them, or a firstAvailable list of 2-3 alternatives.
func genDeviceRequest(r *rand.Rand, name string) resourceapi.DeviceRequest {
	req := resourceapi.DeviceRequest{Name: name}
	switch k := r.Intn(10); {
	case k < 7:
		req.Exactly = &resourceapi.ExactDeviceRequest{
			DeviceClassName: deviceClassFor(r), AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: exactCount(r),
		}
		if k >= 4 {
			req.Exactly.Selectors = celSelectors(pick(r, gpuSelectors...))
		}
	case k == 7:
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: deviceClassFor(r), AllocationMode: resourceapi.DeviceAllocationModeAll}
		if chance(r, 2) {
			req.Exactly.Selectors = celSelectors(pick(r, gpuSelectors...))
		}
	default:
		for i := 0; i < 2+r.Intn(2); i++ {
			sub := resourceapi.DeviceSubRequest{
				Name: fmt.Sprintf("s%d", i), DeviceClassName: deviceClassFor(r),
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: exactCount(r),
			}
			if !chance(r, 3) {
				sub.Selectors = celSelectors(pick(r, gpuSelectors...))
			}
			req.FirstAvailable = append(req.FirstAvailable, sub)
		}
	}
	return req
}
