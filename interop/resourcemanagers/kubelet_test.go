package resourcemanagers

// The kubelet side: the real Topology Manager, CPU Manager policy and Memory Manager policy of
// k8s.io/kubernetes v1.36.3, each policy with its checkpoint-backed state, registered with the
// Topology Manager in the kubelet's order (cm/container_manager_linux.go: device manager, CPU
// manager, memory manager; there are no devices here). The adapters do what cpu_manager.go and
// memory_manager.go do around their policy: removeStaleState before hints and Allocate.

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager"
	cpustate "k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/topology"
	"k8s.io/kubernetes/pkg/kubelet/cm/memorymanager"
	memstate "k8s.io/kubernetes/pkg/kubelet/cm/memorymanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/utils/cpuset"
)

var quiet = logr.Discard()

var buildLock sync.Mutex

// kubeletNode is one node's resource managers, fresh per sequence.
type kubeletNode struct {
	dir    string
	tm     topologymanager.Manager
	cpu    *cpuProvider
	mem    *memProvider
	active map[string]*v1.Pod
}

type cpuProvider struct {
	node   *kubeletNode
	policy cpumanager.Policy
	state  cpustate.State
}

// removeStaleState: cpu_manager.go's, over the harness's active pods (sources are ready).
func (p *cpuProvider) removeStaleState() {
	for podUID, containers := range p.state.GetCPUAssignments() {
		for name := range containers {
			if p.node.isActive(podUID, name) {
				continue
			}
			_ = p.policy.RemoveContainer(quiet, p.state, podUID, name)
		}
	}
}

func (p *cpuProvider) GetTopologyHints(pod *v1.Pod, c *v1.Container) map[string][]topologymanager.TopologyHint {
	p.removeStaleState()
	return p.policy.GetTopologyHints(quiet, p.state, pod, c)
}

func (p *cpuProvider) GetPodTopologyHints(pod *v1.Pod) map[string][]topologymanager.TopologyHint {
	p.removeStaleState()
	return p.policy.GetPodTopologyHints(quiet, p.state, pod)
}

func (p *cpuProvider) AllocatePod(pod *v1.Pod) error {
	p.removeStaleState()
	return p.policy.AllocatePod(quiet, p.state, pod)
}

func (p *cpuProvider) Allocate(pod *v1.Pod, c *v1.Container) error {
	p.removeStaleState()
	return p.policy.Allocate(quiet, p.state, pod, c)
}

type memProvider struct {
	node   *kubeletNode
	policy memorymanager.Policy
	state  memstate.State
}

// removeStaleState: memory_manager.go's.
func (p *memProvider) removeStaleState() {
	for podUID, containers := range p.state.GetMemoryAssignments() {
		for name := range containers {
			if !p.node.isActive(podUID, name) {
				p.policy.RemoveContainer(quiet, p.state, podUID, name)
			}
		}
	}
}

func (p *memProvider) GetTopologyHints(pod *v1.Pod, c *v1.Container) map[string][]topologymanager.TopologyHint {
	p.removeStaleState()
	return p.policy.GetTopologyHints(quiet, p.state, pod, c)
}

func (p *memProvider) GetPodTopologyHints(pod *v1.Pod) map[string][]topologymanager.TopologyHint {
	p.removeStaleState()
	return p.policy.GetPodTopologyHints(quiet, p.state, pod)
}

func (p *memProvider) AllocatePod(pod *v1.Pod) error {
	p.removeStaleState()
	return p.policy.AllocatePod(quiet, p.state, pod)
}

func (p *memProvider) Allocate(pod *v1.Pod, c *v1.Container) error {
	p.removeStaleState()
	return p.policy.Allocate(quiet, p.state, pod, c)
}

func (n *kubeletNode) isActive(podUID, container string) bool {
	pod, ok := n.active[podUID]
	if !ok {
		return false
	}
	for _, c := range append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name == container {
			return true
		}
	}
	return false
}

// setFeatureGates sets every gate the case names, and resets the ones other cases set.
func setFeatureGates(gates map[string]bool) error {
	all := map[string]bool{
		"CPUManagerPolicyAlphaOptions":      false,
		"CPUManagerPolicyBetaOptions":       true,
		"TopologyManagerPolicyAlphaOptions": false,
		"TopologyManagerPolicyBetaOptions":  true,
		"PodLevelResources":                 true,
		"PodLevelResourceManagers":          false,
	}
	for k, v := range gates {
		all[k] = v
	}
	return utilfeature.DefaultMutableFeatureGate.SetFromMap(all)
}

// newKubeletNode builds the managers as the kubelet does at start (cmd/kubelet/app/server.go,
// cm/container_manager_linux.go, cpu_manager.go NewManager, memory_manager.go NewManager);
// an error is a configuration the kubelet refuses.
func newKubeletNode(c *Case, dir string) (*kubeletNode, error) {
	// The gates are process-wide; the policies read the option gates only when built.
	buildLock.Lock()
	defer buildLock.Unlock()
	if err := setFeatureGates(c.FeatureGates); err != nil {
		return nil, fmt.Errorf("featureGates: %w", err)
	}
	mi := c.Shape.MachineInfo()
	tm, err := topologymanager.NewManager(mi.Topology, c.TopologyPolicy, c.TopologyScope, c.TopologyOptions)
	if err != nil {
		return nil, fmt.Errorf("topology manager: %w", err)
	}
	node := &kubeletNode{dir: dir, tm: tm, active: map[string]*v1.Pod{}}

	// server.go: reservedSystemCPUs overrides the cpu of kubeReserved and systemReserved.
	kubeReserved := copyMap(c.KubeReserved)
	systemReserved := copyMap(c.SystemReserved)
	specific := cpuset.New()
	if c.ReservedSystemCPUs != "" {
		topo, err := topology.Discover(quiet, mi)
		if err != nil {
			return nil, err
		}
		specific, err = cpuset.Parse(c.ReservedSystemCPUs)
		if err != nil {
			return nil, fmt.Errorf("unable to parse reserved-cpus list: %w", err)
		}
		if !specific.IsSubsetOf(topo.CPUDetails.CPUs()) {
			return nil, fmt.Errorf("reserved-cpus: %s is not a subset of online-cpus", c.ReservedSystemCPUs)
		}
		if specific.Size() > 0 {
			delete(kubeReserved, "cpu")
			systemReserved["cpu"] = strconv.Itoa(specific.Size())
		}
	}
	reservation, err := nodeAllocatableReservation(kubeReserved, systemReserved, c.EvictionHard)
	if err != nil {
		return nil, err
	}

	// CPU manager (cpu_manager.go NewManager + Start).
	cpuPolicyName := c.CPUPolicy
	if cpuPolicyName == "" {
		cpuPolicyName = "none"
	}
	var cpuPolicy cpumanager.Policy
	switch cpuPolicyName {
	case "none":
		cpuPolicy, err = cpumanager.NewNonePolicy(c.CPUOptions)
		if err != nil {
			return nil, fmt.Errorf("new none policy error: %w", err)
		}
	case "static":
		topo, err := topology.Discover(quiet, mi)
		if err != nil {
			return nil, err
		}
		reserved, ok := reservation[v1.ResourceCPU]
		if !ok || reserved.IsZero() {
			return nil, fmt.Errorf("[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero")
		}
		numReserved := int(math.Ceil(float64(reserved.MilliValue()) / 1000))
		cpuPolicy, err = cpumanager.NewStaticPolicy(quiet, topo, numReserved, specific, tm, c.CPUOptions)
		if err != nil {
			return nil, fmt.Errorf("new static policy error: %w", err)
		}
	default:
		return nil, fmt.Errorf("unknown policy: %q", cpuPolicyName)
	}
	cs, err := cpustate.NewCheckpointState(quiet, dir, "cpu_manager_state", cpuPolicy.Name(), nil)
	if err != nil {
		return nil, err
	}
	if err := cpuPolicy.Start(quiet, cs); err != nil {
		return nil, err
	}
	node.cpu = &cpuProvider{node: node, policy: cpuPolicy, state: cs}

	// Memory manager (memory_manager.go NewManager + Start), only when the case has one.
	if c.MemoryPolicy != "" {
		// NewManager validates reservedMemory against Node Allocatable; its policy is
		// rebuilt below because the manager hides it.
		var reservedMemory []kubeletconfig.MemoryReservation
		for _, r := range c.ReservedMemory {
			limits := v1.ResourceList{}
			for k, v := range r.Limits {
				q, err := resource.ParseQuantity(v)
				if err != nil {
					return nil, fmt.Errorf("reservedMemory: %w", err)
				}
				limits[v1.ResourceName(k)] = q
			}
			reservedMemory = append(reservedMemory, kubeletconfig.MemoryReservation{NumaNode: r.NumaNode, Limits: limits})
		}
		if _, err := memorymanager.NewManager(quiet, c.MemoryPolicy, mi, reservation, reservedMemory, dir, tm); err != nil {
			return nil, err
		}
		var memPolicy memorymanager.Policy
		switch c.MemoryPolicy {
		case "None":
			memPolicy = memorymanager.NewPolicyNone(quiet)
		case "Static":
			// convertReserved
			reserved := map[int]map[v1.ResourceName]uint64{}
			for _, n := range mi.Topology {
				reserved[n.Id] = map[v1.ResourceName]uint64{}
			}
			for _, r := range reservedMemory {
				for name, q := range r.Limits {
					val, _ := q.AsInt64()
					reserved[int(r.NumaNode)][name] = uint64(val)
				}
			}
			memPolicy, err = memorymanager.NewPolicyStatic(quiet, mi, reserved, tm)
			if err != nil {
				return nil, err
			}
		}
		ms, err := memstate.NewCheckpointState(quiet, dir, "memory_manager_state", memPolicy.Name())
		if err != nil {
			return nil, err
		}
		if err := memPolicy.Start(quiet, ms); err != nil {
			return nil, err
		}
		node.mem = &memProvider{node: node, policy: memPolicy, state: ms}
	}
	// container_manager_linux.go: device manager (no devices here), CPU, memory.
	tm.AddHintProvider(quiet, node.cpu)
	if node.mem != nil {
		tm.AddHintProvider(quiet, node.mem)
	}
	return node, nil
}

func copyMap(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// nodeAllocatableReservation: node_container_manager_linux.go GetNodeAllocatableReservation
// (system + kube reserved + the hard eviction threshold of memory.available).
func nodeAllocatableReservation(kube, system, eviction map[string]string) (v1.ResourceList, error) {
	out := v1.ResourceList{}
	add := func(name string, text string) error {
		q, err := resource.ParseQuantity(text)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		cur := out[v1.ResourceName(name)]
		cur.Add(q)
		out[v1.ResourceName(name)] = cur
		return nil
	}
	for _, m := range []map[string]string{system, kube} {
		for k, v := range m {
			if err := add(k, v); err != nil {
				return nil, err
			}
		}
	}
	if v, ok := eviction["memory.available"]; ok {
		if err := add("memory", v); err != nil {
			return nil, err
		}
	}
	for k, v := range out {
		if v.IsZero() {
			delete(out, k)
		}
	}
	return out, nil
}

// admit runs the Topology Manager's admit handler and reads back what each container got.
func (n *kubeletNode) admit(pod *v1.Pod) StepResult {
	// kubelet.go HandlePodAdditions adds the pod to the pod manager before admission, so it
	// is among the active pods that removeStaleState keeps while it is being admitted.
	n.active[string(pod.UID)] = pod
	res := n.tm.Admit(&lifecycle.PodAdmitAttributes{Pod: pod})
	out := StepResult{Admitted: res.Admit, Reason: res.Reason, Message: res.Message}
	if !res.Admit {
		// rejectPod makes the pod Failed, so it is no longer active. The kubelet frees what a rejected pod got at the next removeStaleState (the next
		// admission's hints); devicelet frees it at once. Do it now so the state files after
		// the step compare (see knownDivergences).
		delete(n.active, string(pod.UID))
		n.cpu.removeStaleState()
		if n.mem != nil {
			n.mem.removeStaleState()
		}
		return out
	}
	for _, c := range append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		cr := ContainerResult{Name: c.Name, Memory: []MemoryBlock{}}
		if set, ok := n.cpu.state.GetCPUSet(string(pod.UID), c.Name); ok {
			cr.CPUs = set.String()
		}
		hint := n.tm.GetAffinity(string(pod.UID), c.Name)
		if hint.NUMANodeAffinity != nil {
			cr.NUMAAffinity = hint.NUMANodeAffinity.GetBits()
			sort.Ints(cr.NUMAAffinity)
		}
		if n.mem != nil {
			for _, b := range n.mem.state.GetMemoryBlocks(string(pod.UID), c.Name) {
				aff := append([]int(nil), b.NUMAAffinity...)
				sort.Ints(aff)
				cr.Memory = append(cr.Memory, MemoryBlock{NUMAAffinity: aff, Type: string(b.Type), Size: b.Size})
			}
		}
		out.Containers = append(out.Containers, cr)
	}
	return out
}

// remove deletes a pod: the kubelet removes each of its containers from the policies
// (RemoveContainer on container removal; removeStaleState does the same for any it missed).
func (n *kubeletNode) remove(uid string) StepResult {
	pod, ok := n.active[uid]
	if !ok {
		return StepResult{Reason: "NotFound"}
	}
	delete(n.active, uid)
	for _, c := range append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		_ = n.cpu.policy.RemoveContainer(quiet, n.cpu.state, uid, c.Name)
		if n.mem != nil {
			n.mem.policy.RemoveContainer(quiet, n.mem.state, uid, c.Name)
		}
	}
	return StepResult{Admitted: true}
}
