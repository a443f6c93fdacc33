package resourcemanagers

// Random cases: a machine shape, a KubeletConfiguration (Topology Manager policy, scope and
// options, CPU Manager policy and options, reserved CPUs, Memory Manager policy and reserved
// memory) and a sequence of pod admissions and removals. Everything comes from one seed.

import (
	"fmt"
	"math/rand"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

type MemReservation struct {
	NumaNode int32             `json:"numaNode"`
	Limits   map[string]string `json:"limits"`
}

// Case is one configuration and its sequence.
type Case struct {
	Index              int               `json:"index"`
	Shape              Shape             `json:"shape"`
	TopologyPolicy     string            `json:"topologyManagerPolicy"`
	TopologyScope      string            `json:"topologyManagerScope"`
	TopologyOptions    map[string]string `json:"topologyManagerPolicyOptions,omitempty"`
	CPUPolicy          string            `json:"cpuManagerPolicy"`
	CPUOptions         map[string]string `json:"cpuManagerPolicyOptions,omitempty"`
	ReservedSystemCPUs string            `json:"reservedSystemCPUs,omitempty"`
	KubeReserved       map[string]string `json:"kubeReserved,omitempty"`
	SystemReserved     map[string]string `json:"systemReserved,omitempty"`
	EvictionHard       map[string]string `json:"evictionHard,omitempty"`
	MemoryPolicy       string            `json:"memoryManagerPolicy,omitempty"`
	ReservedMemory     []MemReservation  `json:"reservedMemory,omitempty"`
	FeatureGates       map[string]bool   `json:"featureGates,omitempty"`
	Steps              []Step            `json:"steps"`
}

// Step is one admission or removal (the `devicelet resources replay` step format).
type Step struct {
	Admit  *v1.Pod `json:"admit,omitempty"`
	Remove string  `json:"remove,omitempty"`
}

// KubeletConfig is the case's KubeletConfiguration as devicelet reads it.
func (c *Case) KubeletConfig(sysfsRoot string) map[string]any {
	cfg := map[string]any{
		"apiVersion":            "kubelet.config.k8s.io/v1beta1",
		"kind":                  "KubeletConfiguration",
		"topologyManagerPolicy": c.TopologyPolicy,
		"topologyManagerScope":  c.TopologyScope,
		"cpuManagerPolicy":      c.CPUPolicy,
		"evictionHard":          c.EvictionHard,
		"devicelet":             map[string]any{"sysfsRoot": sysfsRoot},
	}
	if len(c.TopologyOptions) > 0 {
		cfg["topologyManagerPolicyOptions"] = c.TopologyOptions
	}
	if len(c.CPUOptions) > 0 {
		cfg["cpuManagerPolicyOptions"] = c.CPUOptions
	}
	if c.ReservedSystemCPUs != "" {
		cfg["reservedSystemCPUs"] = c.ReservedSystemCPUs
	}
	if len(c.KubeReserved) > 0 {
		cfg["kubeReserved"] = c.KubeReserved
	}
	if len(c.SystemReserved) > 0 {
		cfg["systemReserved"] = c.SystemReserved
	}
	if c.MemoryPolicy != "" {
		cfg["memoryManagerPolicy"] = c.MemoryPolicy
		cfg["reservedMemory"] = c.ReservedMemory
	}
	if len(c.FeatureGates) > 0 {
		cfg["featureGates"] = c.FeatureGates
	}
	return cfg
}

var cpuOptionNames = []string{
	"full-pcpus-only",
	"distribute-cpus-across-numa",
	"align-by-socket",
	"distribute-cpus-across-cores",
	"strict-cpu-reservation",
	"prefer-align-cpus-by-uncorecache",
}

var alphaCPUOptions = map[string]bool{"align-by-socket": true, "distribute-cpus-across-cores": true}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.Intn(len(xs))] }

// genCase draws a configuration and a sequence for the given areas.
func genCase(r *rand.Rand, index int, areas map[string]bool) *Case {
	c := &Case{
		Index:          index,
		Shape:          shapes[r.Intn(len(shapes))],
		TopologyPolicy: pick(r, "none", "best-effort", "restricted", "single-numa-node"),
		TopologyScope:  pick(r, "container", "pod"),
		CPUPolicy:      "static",
		EvictionHard:   map[string]string{"memory.available": "100Mi"},
		FeatureGates:   map[string]bool{},
	}
	// podlevel: KEP-5526 pod-level resource managers. Half the cases add the Memory Manager,
	// a quarter the CPU options; most turn both gates on, some leave them off (pods with
	// pod-level resources are then left alone), a few turn on PodLevelResourceManagers
	// without PodLevelResources (the kubelet refuses the configuration).
	podlevel := areas["podlevel"]
	memory := areas["memory"]
	if podlevel && !memory {
		memory = r.Intn(2) == 0
	}
	if podlevel {
		switch x := r.Intn(20); {
		case x < 16:
			c.FeatureGates["PodLevelResources"] = true
			c.FeatureGates["PodLevelResourceManagers"] = true
		case x < 19:
		default:
			c.FeatureGates["PodLevelResources"] = false
			c.FeatureGates["PodLevelResourceManagers"] = true
		}
	}
	// The kubelet's merge tries every combination of the providers' hints: with memory and
	// huge pages hints on 8 NUMA nodes that is 255^3 or more per container, minutes per case.
	// best-effort and restricted are exercised on the shapes with at most 4 NUMA nodes there.
	if memory && c.Shape.numaNodes() > 4 && (c.TopologyPolicy == "best-effort" || c.TopologyPolicy == "restricted") {
		c.TopologyPolicy = pick(r, "none", "single-numa-node")
	}
	if r.Intn(5) == 0 {
		c.TopologyOptions = map[string]string{"prefer-closest-numa-nodes": pick(r, "true", "false")}
	}
	if r.Intn(12) == 0 {
		c.CPUPolicy = "none"
	}
	if (areas["cpu-options"] || (podlevel && r.Intn(4) == 0)) && c.CPUPolicy == "static" {
		opts := map[string]string{}
		for _, name := range cpuOptionNames {
			if r.Intn(4) == 0 {
				opts[name] = "true"
			}
		}
		switch r.Intn(30) {
		case 0:
			opts["no-such-option"] = "true"
		case 1:
			opts["full-pcpus-only"] = "maybe"
		case 2:
			opts["full-pcpus-only"] = "false"
		}
		alpha := false
		for name := range opts {
			alpha = alpha || alphaCPUOptions[name]
		}
		// Alpha options need their gate; now and then it is missing (the kubelet refuses).
		if alpha && r.Intn(8) != 0 {
			c.FeatureGates["CPUManagerPolicyAlphaOptions"] = true
		}
		if len(opts) > 0 {
			c.CPUOptions = opts
		}
	}
	// Reserved CPUs: a list, or kube+system reserved rounded up.
	cores := c.Shape.coreList()
	switch r.Intn(4) {
	case 0:
		c.ReservedSystemCPUs = cpuList(append([]int(nil), cores[0].threads...))
	case 1:
		c.ReservedSystemCPUs = cpuList([]int{cores[0].threads[0], cores[len(cores)-1].threads[0]})
	default:
		c.KubeReserved = map[string]string{"cpu": pick(r, "500m", "1", "1500m", "2")}
		if r.Intn(3) == 0 {
			c.SystemReserved = map[string]string{"cpu": pick(r, "100m", "1")}
		}
		if r.Intn(40) == 0 {
			c.KubeReserved["cpu"] = "0" // the static policy refuses a zero reservation
		}
	}
	if memory {
		c.MemoryPolicy = "Static"
		if c.KubeReserved == nil {
			c.KubeReserved = map[string]string{}
		}
		// reservedMemory must add up to kubeReserved + systemReserved + evictionHard.
		perNode := pick(r, 256, 512, 1024)
		n := c.Shape.numaNodes()
		c.KubeReserved["memory"] = fmt.Sprintf("%dMi", perNode*n-100)
		for i := 0; i < n; i++ {
			c.ReservedMemory = append(c.ReservedMemory, MemReservation{NumaNode: int32(i), Limits: map[string]string{"memory": fmt.Sprintf("%dMi", perNode)}})
		}
		if r.Intn(30) == 0 {
			c.ReservedMemory[0].Limits["memory"] = "1Mi" // totals differ: refused
		}
	}
	genSteps(r, c, areas)
	return c
}

func genSteps(r *rand.Rand, c *Case, areas map[string]bool) {
	n := 4 + r.Intn(14)
	var live []string
	for i := 0; i < n; i++ {
		if len(live) > 0 && r.Intn(10) < 3 {
			k := r.Intn(len(live))
			c.Steps = append(c.Steps, Step{Remove: live[k]})
			live = append(live[:k], live[k+1:]...)
			continue
		}
		var pod *v1.Pod
		if areas["podlevel"] && r.Intn(10) < 7 {
			pod = genPodLevelPod(r, c, i)
		} else {
			pod = genPod(r, c, i, areas)
		}
		live = append(live, string(pod.UID))
		c.Steps = append(c.Steps, Step{Admit: pod})
	}
}

type qos int

const (
	guaranteed qos = iota
	burstable
	bestEffort
)

func genPod(r *rand.Rand, c *Case, i int, areas map[string]bool) *v1.Pod {
	q := guaranteed
	switch x := r.Intn(10); {
	case x < 2:
		q = burstable
	case x < 3:
		q = bestEffort
	}
	uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", c.Index, i)
	pod := &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: "default", UID: types.UID(uid)},
	}
	nodeCPUs := c.Shape.CoresPerNUMA * c.Shape.ThreadsPerCore
	memory := c.MemoryPolicy != ""
	container := func(name string) v1.Container {
		ct := v1.Container{Name: name, Image: "registry.k8s.io/pause:3.10"}
		if q == bestEffort {
			return ct
		}
		var cpu string
		switch x := r.Intn(10); {
		case x < 6:
			cpu = fmt.Sprint(1 + r.Intn(4))
		case x < 8:
			cpu = pick(r, "100m", "500m", "1500m", "250m")
		default:
			// Large: a whole NUMA node or more.
			cpu = fmt.Sprint(pick(r, nodeCPUs, nodeCPUs+2, 2*nodeCPUs-1, nodeCPUs/2+1))
		}
		mem := pick(r, "128Mi", "512Mi", "1Gi", "3Gi")
		if memory && r.Intn(8) == 0 {
			mem = fmt.Sprintf("%dGi", c.Shape.MemoryBytes/gib+uint64(r.Intn(4))) // more than a node
		}
		res := v1.ResourceList{v1.ResourceCPU: resource.MustParse(cpu), v1.ResourceMemory: resource.MustParse(mem)}
		if memory && r.Intn(4) == 0 {
			if c.Shape.Huge2Mi > 0 {
				res["hugepages-2Mi"] = resource.MustParse(fmt.Sprintf("%dMi", 2*(1+r.Intn(int(c.Shape.Huge2Mi/2)))))
			} else if c.Shape.Huge1Gi > 0 {
				res["hugepages-1Gi"] = resource.MustParse(fmt.Sprintf("%dGi", 1+r.Intn(int(c.Shape.Huge1Gi))))
			}
		}
		if q == guaranteed {
			ct.Resources = v1.ResourceRequirements{Requests: res, Limits: res}
		} else {
			lim := res.DeepCopy()
			lim[v1.ResourceCPU] = resource.MustParse(fmt.Sprint(8))
			ct.Resources = v1.ResourceRequirements{Requests: res, Limits: lim}
			if r.Intn(2) == 0 {
				ct.Resources.Limits = nil
				for k := range res {
					if k != v1.ResourceCPU && k != v1.ResourceMemory {
						ct.Resources.Limits = v1.ResourceList{k: res[k]}
					}
				}
			}
		}
		return ct
	}
	for k := 0; k < 1+r.Intn(3); k++ {
		pod.Spec.Containers = append(pod.Spec.Containers, container(fmt.Sprintf("app-%d", k)))
	}
	if r.Intn(3) == 0 {
		for k := 0; k < 1+r.Intn(2); k++ {
			ct := container(fmt.Sprintf("init-%d", k))
			if r.Intn(2) == 0 {
				always := v1.ContainerRestartPolicyAlways
				ct.RestartPolicy = &always
				ct.Name = fmt.Sprintf("sidecar-%d", k)
			}
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, ct)
		}
	}
	return pod
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// genPodLevelPod draws a pod with pod-level resources (spec.resources, KEP-2837) that the API
// server would accept: the pod's requests cover its containers' (app containers and sidecars
// together, or the largest init phase), its limits its containers'. Containers are Guaranteed
// on their own (integral or fractional CPUs), Burstable (requests only) or have no resources;
// the pod is Guaranteed (requests equal limits) most of the time. Now and then the pod's CPUs
// or memory leave nothing for the containers that share them (the kubelet refuses those).
func genPodLevelPod(r *rand.Rand, c *Case, i int) *v1.Pod {
	uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", c.Index, i)
	pod := &v1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: "default", UID: types.UID(uid)},
	}
	nodeCPUs := c.Shape.CoresPerNUMA * c.Shape.ThreadsPerCore
	memory := c.MemoryPolicy != ""
	const mi = int64(1) << 20
	hugeName, hugeUnit := "", int64(0)
	if memory && c.Shape.Huge2Mi > 0 {
		hugeName, hugeUnit = "hugepages-2Mi", 2*mi
	} else if memory && c.Shape.Huge1Gi > 0 {
		hugeName, hugeUnit = "hugepages-1Gi", 1024*mi
	}
	// amounts: milli-CPUs, memory bytes, hugepages bytes.
	type amounts struct{ cpu, mem, huge int64 }
	container := func(name string) (v1.Container, amounts) {
		ct := v1.Container{Name: name, Image: "registry.k8s.io/pause:3.10"}
		var a amounts
		switch x := r.Intn(10); {
		case x < 4: // Guaranteed on its own, whole CPUs: exclusive CPUs and memory.
			a = amounts{cpu: int64(1+r.Intn(3)) * 1000, mem: pick(r, int64(128), 256, 512, 1024) * mi}
			if hugeName != "" && r.Intn(4) == 0 {
				a.huge = hugeUnit * int64(1+r.Intn(2))
			}
		case x < 5: // Guaranteed on its own, fractional CPUs: shared CPUs, exclusive memory.
			a = amounts{cpu: pick(r, int64(250), 500, 1500), mem: pick(r, int64(128), 256) * mi}
		case x < 7: // Burstable: requests only.
			a = amounts{cpu: pick(r, int64(100), 200, 1000), mem: pick(r, int64(64), 128) * mi}
			ct.Resources = v1.ResourceRequirements{Requests: v1.ResourceList{
				v1.ResourceCPU:    *resource.NewMilliQuantity(a.cpu, resource.DecimalSI),
				v1.ResourceMemory: *resource.NewQuantity(a.mem, resource.BinarySI),
			}}
			return ct, a
		default: // Nothing of its own.
			return ct, a
		}
		res := v1.ResourceList{
			v1.ResourceCPU:    *resource.NewMilliQuantity(a.cpu, resource.DecimalSI),
			v1.ResourceMemory: *resource.NewQuantity(a.mem, resource.BinarySI),
		}
		if a.huge > 0 {
			res[v1.ResourceName(hugeName)] = *resource.NewQuantity(a.huge, resource.BinarySI)
		}
		ct.Resources = v1.ResourceRequirements{Requests: res, Limits: res.DeepCopy()}
		return ct, a
	}
	var apps, sidecars, initPeak amounts
	add := func(x *amounts, a amounts) { x.cpu += a.cpu; x.mem += a.mem; x.huge += a.huge }
	maxInto := func(x *amounts, a amounts) {
		x.cpu = max(x.cpu, a.cpu)
		x.mem = max(x.mem, a.mem)
		x.huge = max(x.huge, a.huge)
	}
	if r.Intn(3) == 0 {
		for k := 0; k < 1+r.Intn(2); k++ {
			ct, a := container(fmt.Sprintf("init-%d", k))
			if r.Intn(2) == 0 {
				always := v1.ContainerRestartPolicyAlways
				ct.RestartPolicy = &always
				ct.Name = fmt.Sprintf("sidecar-%d", k)
				add(&sidecars, a)
			} else {
				phase := sidecars
				add(&phase, a)
				maxInto(&initPeak, phase)
			}
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, ct)
		}
	}
	for k := 0; k < 1+r.Intn(3); k++ {
		ct, a := container(fmt.Sprintf("app-%d", k))
		add(&apps, a)
		pod.Spec.Containers = append(pod.Spec.Containers, ct)
	}
	need := apps
	add(&need, sidecars)
	maxInto(&need, initPeak)
	// The pod's CPUs: whole CPUs covering the containers plus 0-2 more, a whole NUMA node now
	// and then, or (rarely) a fraction.
	cpu := (need.cpu+999)/1000*1000 + int64(r.Intn(3))*1000
	switch x := r.Intn(12); {
	case x == 0 && int64(nodeCPUs)*1000 >= need.cpu:
		cpu = int64(nodeCPUs) * 1000
	case x == 1:
		cpu = need.cpu + 500
	}
	if cpu == 0 {
		cpu = 1000
	}
	mem := need.mem + pick(r, int64(0), 256, 1024)*mi
	if mem == 0 {
		mem = 256 * mi
	}
	huge := need.huge
	if hugeName != "" && r.Intn(6) == 0 {
		huge += hugeUnit
	}
	requests := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(cpu, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(mem, resource.BinarySI),
	}
	if huge > 0 {
		requests[v1.ResourceName(hugeName)] = *resource.NewQuantity(huge, resource.BinarySI)
	}
	pod.Spec.Resources = &v1.ResourceRequirements{Requests: requests, Limits: requests.DeepCopy()}
	switch r.Intn(10) {
	case 0: // Burstable: higher CPU limit.
		pod.Spec.Resources.Limits[v1.ResourceCPU] = *resource.NewMilliQuantity(cpu+2000, resource.DecimalSI)
	case 1: // Burstable: requests only.
		pod.Spec.Resources.Limits = nil
	}
	return pod
}
