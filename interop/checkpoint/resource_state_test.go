package checkpoint

// The resource managers' state files, memory_manager_state and cpu_manager_state, in both
// directions against the kubelet's own state code (k8s.io/kubernetes v1.36.3
// pkg/kubelet/cm/memorymanager/state and pkg/kubelet/cm/cpumanager/state, whose
// NewCheckpointState verifies the checksum and whose setters write through the checkpoint
// manager): the kubelet loads what `devicelet serve` wrote, and devicelet (`state inspect`,
// `serve`) loads what the kubelet wrote. The machine is described in the configuration
// (docs/topology.md), so no real NUMA hardware is needed.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	cpustate "k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/checkpoint"
	memstate "k8s.io/kubernetes/pkg/kubelet/cm/memorymanager/state"
	"k8s.io/utils/cpuset"
)

const (
	memoryStateFile = "memory_manager_state"
	cpuStateFile    = "cpu_manager_state"
	gi              = uint64(1) << 30
	mi              = uint64(1) << 20
	hugepages2Mi    = v1.ResourceName("hugepages-2Mi")
)

// resourceConfig: static CPU policy (CPU 0 reserved) and Static memory policy on a described
// machine of 2 NUMA nodes with 4 CPUs, 4Gi of memory and 512 2Mi huge pages each; 1Gi of
// memory reserved on node 0 (924Mi kubeReserved + the default 100Mi hard eviction).
const resourceConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
reservedSystemCPUs: "0"
memoryManagerPolicy: Static
kubeReserved: {memory: 924Mi}
reservedMemory:
- {numaNode: 0, limits: {memory: 1Gi}}
devicelet:
  machine: {nodes: 2, cpusPerNode: 4}
  memory: {perNode: 4Gi, hugepagesPerNode: {2Mi: 512}}
`

// otherMachineConfig is the same policies on a machine with 8Gi per node: a state written for
// resourceConfig's machine does not describe it.
var otherMachineConfig = strings.Replace(resourceConfig, "perNode: 4Gi", "perNode: 8Gi", 1)

func writeConfig(t *testing.T, dir, text string) string {
	t.Helper()
	file := filepath.Join(dir, "kubelet.yaml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// serveWithConfig is the harness's serve with `--config file`.
func serveWithConfig(t *testing.T, root, config string) *proc {
	t.Helper()
	p := spawn(t, root, "serve --config", nil, "serve", "--metrics-address", "off", "--config", config)
	waitFor(t, p, "the control API", func() bool {
		_, _, err := cli(t, root, "get", "resources", "-o", "json")
		return err == nil
	})
	return p
}

// guaranteedPod is a one-container Guaranteed pod (requests = limits).
func guaranteedPod(uid, name, cpu, memory, hugepages string) string {
	limits := fmt.Sprintf("{cpu: %q, memory: %s", cpu, memory)
	if hugepages != "" {
		limits += ", hugepages-2Mi: " + hugepages
	}
	limits += "}"
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default, uid: %s}
spec:
  containers:
  - name: app
    resources:
      requests: %s
      limits: %s
`, name, uid, limits, limits)
}

type admitOutput struct {
	Containers []struct {
		Name   string `json:"name"`
		CPUs   string `json:"cpus"`
		Memory []struct {
			Type      string  `json:"type"`
			Size      uint64  `json:"size"`
			NUMANodes []int64 `json:"numaNodes"`
		} `json:"memory"`
	} `json:"containers"`
}

// admit runs `devicelet admit -f` for a manifest; the pod must be admitted.
func admit(t *testing.T, root, uid, manifest string) admitOutput {
	t.Helper()
	file := filepath.Join(root, uid+".yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	var out admitOutput
	cliJSON(t, root, &out, "admit", "-f", file, "-o", "json")
	if len(out.Containers) != 1 || out.Containers[0].Name != "app" {
		t.Fatalf("devicelet admit %s: unexpected answer %+v", uid, out)
	}
	return out
}

// block is a memory block in a comparable form.
type block struct {
	Type string
	Size uint64
	NUMA string
}

func kubeletBlocks(blocks []memstate.Block) []block {
	var out []block
	for _, b := range blocks {
		out = append(out, block{string(b.Type), b.Size, fmt.Sprint(b.NUMAAffinity)})
	}
	return out
}

func admittedBlocks(a admitOutput) []block {
	var out []block
	for _, m := range a.Containers[0].Memory {
		out = append(out, block{m.Type, m.Size, fmt.Sprint(m.NUMANodes)})
	}
	return out
}

// sameBlocks compares in order: the kubelet and devicelet both keep a container's blocks in
// resource-name order (hugepages-2Mi before memory), so a different order is a difference.
func sameBlocks(a, b []block) bool { return reflect.DeepEqual(a, b) }

// memTable is a memstate.MemoryTable as the tests write it.
func memTable(total, systemReserved, allocatable, reserved uint64) *memstate.MemoryTable {
	return &memstate.MemoryTable{
		TotalMemSize:   total,
		SystemReserved: systemReserved,
		Allocatable:    allocatable,
		Reserved:       reserved,
		Free:           allocatable - reserved,
	}
}

// machineState is resourceConfig's machine (4Gi and 1Gi of 2Mi pages per node, 1Gi of memory
// reserved on node 0) with the given bytes reserved for containers and block counts.
func machineState(mem0, huge0 uint64, n0 int, mem1, huge1 uint64, n1 int) memstate.NUMANodeMap {
	return memstate.NUMANodeMap{
		0: {
			NumberOfAssignments: n0,
			Cells:               []int{0},
			MemoryMap: map[v1.ResourceName]*memstate.MemoryTable{
				v1.ResourceMemory: memTable(4*gi, gi, 2*gi, mem0),
				hugepages2Mi:      memTable(gi, 0, gi, huge0),
			},
		},
		1: {
			NumberOfAssignments: n1,
			Cells:               []int{1},
			MemoryMap: map[v1.ResourceName]*memstate.MemoryTable{
				v1.ResourceMemory: memTable(4*gi, 0, 3*gi, mem1),
				hugepages2Mi:      memTable(gi, 0, gi, huge1),
			},
		},
	}
}

func describeMachine(m memstate.NUMANodeMap) string {
	text, _ := json.Marshal(m)
	return string(text)
}

// loadMemoryWithKubelet is the kubelet's restore of memory_manager_state in dir (checksum
// verified; an error fails the test). The file must exist: on a missing one the kubelet's code
// would create an empty state.
func loadMemoryWithKubelet(t *testing.T, dir string) memstate.State {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, memoryStateFile)); err != nil {
		t.Fatalf("devicelet wrote no %s: %v", memoryStateFile, err)
	}
	st, err := memstate.NewCheckpointState(klog.Background(), dir, memoryStateFile, "Static")
	if err != nil {
		t.Fatalf("the kubelet's memory manager refuses devicelet's %s: %v", memoryStateFile, err)
	}
	return st
}

func loadCPUWithKubelet(t *testing.T, dir string) cpustate.State {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, cpuStateFile)); err != nil {
		t.Fatalf("devicelet wrote no %s: %v", cpuStateFile, err)
	}
	st, err := cpustate.NewCheckpointState(klog.Background(), dir, cpuStateFile, "static", containermap.NewContainerMap())
	if err != nil {
		t.Fatalf("the kubelet's CPU manager refuses devicelet's %s: %v", cpuStateFile, err)
	}
	return st
}

// copyFile copies src into a new directory under the test's temp dir and returns that dir.
func copyFile(t *testing.T, src string, edit func(string) string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	edited := edit(string(data))
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(src)), []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

const (
	podA = "5e1d0000-0000-4000-8000-00000000000a"
	podB = "5e1d0000-0000-4000-8000-00000000000b"
)

// TestKubeletLoadsDeviceletResourceState: devicelet admits two Guaranteed pods (one fits node
// 0's memory, the other only node 1's), stops, and the kubelet's state code loads both files
// with the machine state the admissions imply, each pod's blocks and exclusive CPUs as
// devicelet reported them.
func TestKubeletLoadsDeviceletResourceState(t *testing.T) {
	root := newRoot(t)
	daemon := serveWithConfig(t, root, writeConfig(t, t.TempDir(), resourceConfig))
	a := admit(t, root, podA, guaranteedPod(podA, "a", "2", "1Gi", "4Mi"))
	// Node 0 has 1Gi of memory left: 2Gi fits node 1 only.
	b := admit(t, root, podB, guaranteedPod(podB, "b", "1", "2Gi", ""))
	daemon.terminate(t)

	wantA := []block{{"hugepages-2Mi", 4 * mi, "[0]"}, {"memory", gi, "[0]"}}
	wantB := []block{{"memory", 2 * gi, "[1]"}}
	if got := admittedBlocks(a); !sameBlocks(got, wantA) {
		t.Fatalf("devicelet admitted pod a with memory %+v, want %+v", got, wantA)
	}
	if got := admittedBlocks(b); !sameBlocks(got, wantB) {
		t.Fatalf("devicelet admitted pod b with memory %+v, want %+v", got, wantB)
	}

	mem := loadMemoryWithKubelet(t, root)
	want := machineState(gi, 4*mi, 2, 2*gi, 0, 1)
	if got := mem.GetMachineState(); !reflect.DeepEqual(got, want) {
		t.Errorf("the kubelet reads machine state\n%s\nwant\n%s", describeMachine(got), describeMachine(want))
	}
	for uid, blocks := range map[string][]block{podA: wantA, podB: wantB} {
		if got := kubeletBlocks(mem.GetMemoryBlocks(uid, "app")); !sameBlocks(got, blocks) {
			t.Errorf("the kubelet reads pod %s's blocks %+v, devicelet gave %+v", uid, got, blocks)
		}
	}
	if n := len(mem.GetMemoryAssignments()); n != 2 {
		t.Errorf("the kubelet reads %d pods' memory assignments, want 2: %+v", n, mem.GetMemoryAssignments())
	}

	cpus := loadCPUWithKubelet(t, root)
	all := cpuset.New(0, 1, 2, 3, 4, 5, 6, 7)
	used := cpuset.New()
	for uid, out := range map[string]admitOutput{podA: a, podB: b} {
		want, err := cpuset.Parse(out.Containers[0].CPUs)
		if err != nil {
			t.Fatalf("devicelet admit %s: cpus %q: %v", uid, out.Containers[0].CPUs, err)
		}
		got, ok := cpus.GetCPUSet(uid, "app")
		if !ok || !got.Equals(want) {
			t.Errorf("the kubelet reads pod %s's CPUs %q (present %v), devicelet gave %q", uid, got, ok, want)
		}
		if got.Intersection(used).Size() != 0 || got.Contains(0) {
			t.Errorf("pod %s's CPUs %q overlap another pod's or the reserved CPU 0", uid, got)
		}
		used = used.Union(got)
	}
	if used.Size() != 3 {
		t.Errorf("the kubelet reads %d exclusive CPUs (%q), the pods asked for 3", used.Size(), used)
	}
	if got, want := cpus.GetDefaultCPUSet(), all.Difference(used); !got.Equals(want) {
		t.Errorf("the kubelet reads the default CPU set %q, want %q", got, want)
	}

	// The kubelet does verify: the same file with one byte of content changed is refused
	// (checksum mismatch: ErrCorruptCheckpoint; the CPU manager then falls back to its v1
	// layout, which does not parse either), so the loads above did check devicelet's
	// checksums.
	tampered := copyFile(t, filepath.Join(root, memoryStateFile), func(s string) string {
		return strings.Replace(s, `"size":2147483648`, `"size":2147483647`, 1)
	})
	if _, err := memstate.NewCheckpointState(klog.Background(), tampered, memoryStateFile, "Static"); err == nil || !strings.Contains(err.Error(), "checkpoint is corrupted") {
		t.Errorf("the kubelet loads a tampered %s as not corrupted: %v", memoryStateFile, err)
	}
	tampered = copyFile(t, filepath.Join(root, cpuStateFile), func(s string) string {
		return strings.Replace(s, `"defaultCpuSet":"0`, `"defaultCpuSet":"0-1`, 1)
	})
	if _, err := cpustate.NewCheckpointState(klog.Background(), tampered, cpuStateFile, "static", containermap.NewContainerMap()); err == nil {
		t.Errorf("the kubelet loads a tampered %s", cpuStateFile)
	}
}

// memoryInspect is `devicelet state inspect -o json` for memory_manager_state.
type memoryInspect struct {
	Kind     string `json:"kind"`
	Format   string `json:"format"`
	Valid    bool   `json:"valid"`
	Checksum struct {
		Stored   uint64 `json:"stored"`
		Computed uint64 `json:"computed"`
		OK       bool   `json:"ok"`
	} `json:"checksum"`
	Warnings []string `json:"warnings"`
	Body     struct {
		Type       string `json:"type"`
		PolicyName string `json:"policy_name"`
		Nodes      []struct {
			Node                int64   `json:"node"`
			NumberOfAssignments int     `json:"number_of_assignments"`
			Cells               []int64 `json:"cells"`
			Memory              []struct {
				Resource       string `json:"resource"`
				Total          uint64 `json:"total"`
				SystemReserved uint64 `json:"system_reserved"`
				Allocatable    uint64 `json:"allocatable"`
				Reserved       uint64 `json:"reserved"`
				Free           uint64 `json:"free"`
			} `json:"memory"`
		} `json:"nodes"`
		Entries []struct {
			PodUID       string  `json:"pod_uid"`
			Container    string  `json:"container"`
			Resource     string  `json:"resource"`
			Size         uint64  `json:"size"`
			NUMAAffinity []int64 `json:"numa_affinity"`
		} `json:"entries"`
	} `json:"body"`
}

type cpuInspect struct {
	Kind     string `json:"kind"`
	Valid    bool   `json:"valid"`
	Checksum struct {
		Stored   uint64 `json:"stored"`
		Computed uint64 `json:"computed"`
		OK       bool   `json:"ok"`
	} `json:"checksum"`
	Body struct {
		Type          string `json:"type"`
		PolicyName    string `json:"policy_name"`
		DefaultCPUSet string `json:"default_cpu_set"`
		Entries       []struct {
			Owner     string `json:"owner"`
			Container string `json:"container"`
			CPUSet    string `json:"cpuset"`
		} `json:"entries"`
	} `json:"body"`
}

// storedChecksum is the "checksum" field of a state file.
func storedChecksum(t *testing.T, file string) uint64 {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var top struct {
		Checksum uint64 `json:"checksum"`
	}
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if top.Checksum == 0 {
		t.Fatalf("%s has no checksum", file)
	}
	return top.Checksum
}

const (
	kubeletPod1 = "c0be0000-0000-4000-8000-000000000001"
	kubeletPod2 = "c0be0000-0000-4000-8000-000000000002"
	newPod      = "c0be0000-0000-4000-8000-0000000000ff"
)

// writeKubeletState makes the kubelet's state code write both files in dir for two pods:
// pod 1 with CPUs 1-2 and 1536Mi of memory on node 0, pod 2 with CPUs 4-6, 1Gi of memory and
// 8Mi of 2Mi pages on node 1. CPUs 0 (reserved), 3 and 7 stay in the default set; node 0 keeps
// 512Mi of memory free, node 1 2Gi.
func writeKubeletState(t *testing.T, dir string) {
	t.Helper()
	mem, err := memstate.NewCheckpointState(klog.Background(), dir, memoryStateFile, "Static")
	if err != nil {
		t.Fatal(err)
	}
	mem.SetMachineState(machineState(1536*mi, 0, 1, gi, 8*mi, 2))
	mem.SetMemoryBlocks(kubeletPod1, "app", []memstate.Block{
		{NUMAAffinity: []int{0}, Type: v1.ResourceMemory, Size: 1536 * mi},
	})
	mem.SetMemoryBlocks(kubeletPod2, "app", []memstate.Block{
		{NUMAAffinity: []int{1}, Type: hugepages2Mi, Size: 8 * mi},
		{NUMAAffinity: []int{1}, Type: v1.ResourceMemory, Size: gi},
	})
	cpus, err := cpustate.NewCheckpointState(klog.Background(), dir, cpuStateFile, "static", containermap.NewContainerMap())
	if err != nil {
		t.Fatal(err)
	}
	cpus.SetDefaultCPUSet(cpuset.New(0, 3, 7))
	cpus.SetCPUSet(kubeletPod1, "app", cpuset.New(1, 2))
	cpus.SetCPUSet(kubeletPod2, "app", cpuset.New(4, 5, 6))
}

// importKubeletDevices gives devicelet the kubelet's pods: the kubelet's checkpoint code writes
// a device checkpoint with a GPU for each of the two pods of writeKubeletState, and
// `devicelet state import` takes it over. Like the kubelet's removeStaleState, `devicelet
// serve` frees the CPUs and memory of pods that are not active, and standalone the active pods
// are the admitted ones (its journal, or an imported device checkpoint); a node taken over
// from a kubelet has all three files.
func importKubeletDevices(t *testing.T, root string) {
	t.Helper()
	var entries []checkpoint.PodDevicesEntry
	for i, pod := range []string{kubeletPod1, kubeletPod2} {
		id := fmt.Sprintf("gpu-%d", i)
		raw, err := proto.Marshal(&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"GPU": id}})
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, checkpoint.PodDevicesEntry{
			PodUID: pod, ContainerName: "app", ResourceName: gpu,
			DeviceIDs: checkpoint.DevicesPerNUMA{int64(i): {id}}, AllocResp: raw,
		})
	}
	src := t.TempDir()
	manager, err := checkpointmanager.NewCheckpointManager(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := manager.CreateCheckpoint(checkpointFile, checkpoint.New(entries, map[string][]string{gpu: {"gpu-0", "gpu-1"}})); err != nil {
		t.Fatalf("the kubelet's CreateCheckpoint: %v", err)
	}
	if out, errOut, err := cli(t, root, "state", "import", "--file", filepath.Join(src, checkpointFile)); err != nil {
		t.Fatalf("devicelet state import: %v\n%s\n%s", err, out, errOut)
	}
}

// TestDeviceletLoadsKubeletResourceState: the kubelet's state code writes both files;
// `devicelet state inspect` verifies them and shows what the kubelet wrote; `devicelet serve`
// with the matching machine starts on them (and on the kubelet's device checkpoint, which names
// the pods) and keeps what they hold: a new Guaranteed pod gets the only free CPUs (3 and 7) and
// node 1's memory (node 0 has 512Mi left), and both files, read back with the kubelet's code,
// hold the kubelet's pods and the new one.
func TestDeviceletLoadsKubeletResourceState(t *testing.T) {
	root := newRoot(t)
	writeKubeletState(t, root)
	memFile := filepath.Join(root, memoryStateFile)
	cpuFile := filepath.Join(root, cpuStateFile)

	var memView memoryInspect
	cliJSON(t, root, &memView, "state", "inspect", "--file", memFile, "-o", "json")
	if sum := storedChecksum(t, memFile); !memView.Valid || !memView.Checksum.OK || memView.Checksum.Stored != sum || memView.Checksum.Computed != sum {
		t.Fatalf("devicelet state inspect does not verify the kubelet's %s (checksum %d): %+v", memoryStateFile, sum, memView)
	}
	if memView.Kind != "memory_manager" || memView.Body.Type != "memory_manager" || memView.Body.PolicyName != "Static" || memView.Format != "v1" {
		t.Fatalf("devicelet state inspect reads the kubelet's %s as %+v", memoryStateFile, memView)
	}
	if len(memView.Warnings) != 0 {
		t.Errorf("devicelet state inspect warns about the kubelet's %s: %v", memoryStateFile, memView.Warnings)
	}
	gotMachine := memstate.NUMANodeMap{}
	for _, n := range memView.Body.Nodes {
		node := &memstate.NUMANodeState{NumberOfAssignments: n.NumberOfAssignments, MemoryMap: map[v1.ResourceName]*memstate.MemoryTable{}}
		for _, c := range n.Cells {
			node.Cells = append(node.Cells, int(c))
		}
		for _, m := range n.Memory {
			node.MemoryMap[v1.ResourceName(m.Resource)] = &memstate.MemoryTable{
				TotalMemSize: m.Total, SystemReserved: m.SystemReserved, Allocatable: m.Allocatable, Reserved: m.Reserved, Free: m.Free,
			}
		}
		gotMachine[int(n.Node)] = node
	}
	if want := machineState(1536*mi, 0, 1, gi, 8*mi, 2); !reflect.DeepEqual(gotMachine, want) {
		t.Errorf("devicelet state inspect shows machine state\n%s\nthe kubelet wrote\n%s", describeMachine(gotMachine), describeMachine(want))
	}
	gotEntries := map[string][]block{}
	for _, e := range memView.Body.Entries {
		key := e.PodUID + "/" + e.Container
		gotEntries[key] = append(gotEntries[key], block{e.Resource, e.Size, fmt.Sprint(e.NUMAAffinity)})
	}
	wantEntries := map[string][]block{
		kubeletPod1 + "/app": {{"memory", 1536 * mi, "[0]"}},
		kubeletPod2 + "/app": {{"hugepages-2Mi", 8 * mi, "[1]"}, {"memory", gi, "[1]"}},
	}
	if !reflect.DeepEqual(gotEntries, wantEntries) {
		t.Errorf("devicelet state inspect shows blocks %+v, the kubelet wrote %+v", gotEntries, wantEntries)
	}
	text, errOut, err := cli(t, root, "state", "inspect", "--file", memFile)
	if err != nil || !strings.Contains(text, "memory_manager_state (memory manager)") || !strings.Contains(text, "VALID:    yes") || !strings.Contains(text, "POLICY: Static") {
		t.Errorf("devicelet state inspect (table) of the kubelet's %s: %v\n%s\n%s", memoryStateFile, err, text, errOut)
	}

	var ci cpuInspect
	cliJSON(t, root, &ci, "state", "inspect", "--file", cpuFile, "-o", "json")
	if sum := storedChecksum(t, cpuFile); !ci.Valid || !ci.Checksum.OK || ci.Checksum.Stored != sum || ci.Checksum.Computed != sum {
		t.Fatalf("devicelet state inspect does not verify the kubelet's %s (checksum %d): %+v", cpuStateFile, sum, ci)
	}
	gotCPUs := map[string]string{}
	for _, e := range ci.Body.Entries {
		gotCPUs[e.Owner+"/"+e.Container] = e.CPUSet
	}
	wantCPUs := map[string]string{kubeletPod1 + "/app": "1-2", kubeletPod2 + "/app": "4-6"}
	if ci.Kind != "cpu_manager" || ci.Body.PolicyName != "static" || ci.Body.DefaultCPUSet != "0,3,7" || !reflect.DeepEqual(gotCPUs, wantCPUs) {
		t.Errorf("devicelet state inspect reads the kubelet's %s as %+v, want default 0,3,7 and %v", cpuStateFile, ci, wantCPUs)
	}

	// serve on the kubelet's files, then a new Guaranteed pod: 2 CPUs, 1Gi of memory, 4Mi of
	// 2Mi pages. Only CPUs 3 and 7 are free, and only node 1 has 1Gi of memory left.
	importKubeletDevices(t, root)
	daemon := serveWithConfig(t, root, writeConfig(t, t.TempDir(), resourceConfig))
	var pods podsOutput
	cliJSON(t, root, &pods, "get", "pods", "-o", "json")
	listed := map[string]bool{}
	for _, p := range pods.Pods {
		listed[p.Pod.UID] = true
	}
	if !listed[kubeletPod1] || !listed[kubeletPod2] || len(pods.Pods) != 2 {
		t.Fatalf("devicelet serve after state import lists pods %v, want the kubelet's two", listed)
	}
	got := admit(t, root, newPod, guaranteedPod(newPod, "new", "2", "1Gi", "4Mi"))
	if cpus := got.Containers[0].CPUs; cpus != "3,7" {
		t.Errorf("the new pod got CPUs %q; the kubelet's file leaves only 3,7 free", cpus)
	}
	wantNew := []block{{"hugepages-2Mi", 4 * mi, "[1]"}, {"memory", gi, "[1]"}}
	if blocks := admittedBlocks(got); !sameBlocks(blocks, wantNew) {
		t.Errorf("the new pod got memory %+v, want %+v (node 0 has 512Mi left)", blocks, wantNew)
	}
	daemon.terminate(t)

	// Both files now hold the kubelet's pods and the new one, and the kubelet loads them.
	mem := loadMemoryWithKubelet(t, root)
	if want, got := machineState(1536*mi, 0, 1, 2*gi, 12*mi, 4), mem.GetMachineState(); !reflect.DeepEqual(got, want) {
		t.Errorf("after the new pod, the kubelet reads machine state\n%s\nwant\n%s", describeMachine(got), describeMachine(want))
	}
	for key, blocks := range wantEntries {
		pod, container, _ := strings.Cut(key, "/")
		if got := kubeletBlocks(mem.GetMemoryBlocks(pod, container)); !sameBlocks(got, blocks) {
			t.Errorf("after the new pod, the kubelet reads %s's blocks %+v, it wrote %+v", key, got, blocks)
		}
	}
	if blocks := kubeletBlocks(mem.GetMemoryBlocks(newPod, "app")); !sameBlocks(blocks, wantNew) {
		t.Errorf("the kubelet reads the new pod's blocks %+v, want %+v", blocks, wantNew)
	}
	cpus := loadCPUWithKubelet(t, root)
	for pod, want := range map[string]cpuset.CPUSet{kubeletPod1: cpuset.New(1, 2), kubeletPod2: cpuset.New(4, 5, 6), newPod: cpuset.New(3, 7)} {
		if got, ok := cpus.GetCPUSet(pod, "app"); !ok || !got.Equals(want) {
			t.Errorf("after the new pod, the kubelet reads pod %s's CPUs %q (present %v), want %q", pod, got, ok, want)
		}
	}
	if got := cpus.GetDefaultCPUSet(); !got.Equals(cpuset.New(0)) {
		t.Errorf("after the new pod, the kubelet reads the default CPU set %q, want 0", got)
	}
}

// TestDeviceletRefusesKubeletStateOfAnotherMachine: the kubelet's memory_manager_state for the
// 4Gi-per-node machine does not describe an 8Gi-per-node one; `devicelet serve` refuses to
// start with the kubelet's validateState message, and leaves the file as it was.
func TestDeviceletRefusesKubeletStateOfAnotherMachine(t *testing.T) {
	root := newRoot(t)
	writeKubeletState(t, root)
	memFile := filepath.Join(root, memoryStateFile)
	before, err := os.ReadFile(memFile)
	if err != nil {
		t.Fatal(err)
	}
	p := spawn(t, root, "serve --config (other machine)", nil, "serve", "--metrics-address", "off", "--config", writeConfig(t, t.TempDir(), otherMachineConfig))
	select {
	case <-p.exited:
	case <-time.After(waitTimeout):
		t.Fatalf("devicelet serve still runs %s after start on another machine's %s\n%s", waitTimeout, memoryStateFile, p.output)
	}
	const want = "[memorymanager] the expected machine state is different from the real one"
	if p.exitErr == nil || !strings.Contains(p.output.String(), want) {
		t.Fatalf("devicelet serve on another machine's %s: exit %v, want a failure with %q\n%s", memoryStateFile, p.exitErr, want, p.output)
	}
	after, err := os.ReadFile(memFile)
	if err != nil || string(after) != string(before) {
		t.Errorf("devicelet serve changed the refused %s (%v):\nbefore %s\nafter  %s", memoryStateFile, err, before, after)
	}
}
