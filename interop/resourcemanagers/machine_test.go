package resourcemanagers

// Machine shapes from real hardware, written both as the sysfs tree devicelet reads
// (crates/devicelet-machine) and as the cadvisor MachineInfo the kubelet's
// cpumanager/topology.Discover, Topology Manager and Memory Manager read.

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"github.com/google/cadvisor/utils/sysfs"
	"github.com/google/cadvisor/utils/sysinfo"
	"k8s.io/utils/cpuset"
)

// Shape describes a machine. CPU numbering follows Linux on x86: the first thread of every
// core in core order, then the second threads (cpu = thread*cores + core).
type Shape struct {
	Name           string
	Sockets        int
	NUMAPerSocket  int
	CoresPerNUMA   int
	ThreadsPerCore int
	// CoresPerL3: cores sharing one L3 (AMD CCX); 0 means one L3 per socket (Intel).
	CoresPerL3 int
	// Per NUMA node.
	MemoryBytes uint64
	Huge2Mi     uint64 // pages of 2Mi
	Huge1Gi     uint64 // pages of 1Gi
}

const gib = uint64(1) << 30

var shapes = []Shape{
	// Intel Xeon Gold 2 sockets, 1 NUMA node each, SMT.
	{Name: "2s-1numa-smt", Sockets: 2, NUMAPerSocket: 1, CoresPerNUMA: 8, ThreadsPerCore: 2, MemoryBytes: 64 * gib, Huge2Mi: 512},
	// Intel with sub-NUMA clustering: 2 sockets x 2 NUMA, SMT.
	{Name: "2s-2numa-smt", Sockets: 2, NUMAPerSocket: 2, CoresPerNUMA: 4, ThreadsPerCore: 2, MemoryBytes: 32 * gib, Huge2Mi: 256, Huge1Gi: 4},
	// AMD EPYC Zen 2 (7452-like) NPS4, 1 socket x 4 NUMA, L3 per 4-core CCX (two per node),
	// SMT: cadvisor reports the L3s as uncore caches.
	{Name: "epyc-1s-4numa", Sockets: 1, NUMAPerSocket: 4, CoresPerNUMA: 8, ThreadsPerCore: 2, CoresPerL3: 4, MemoryBytes: 32 * gib, Huge1Gi: 8},
	// AMD EPYC Zen 3 (7313-like) NPS4, 2 sockets x 4 NUMA, L3 per 4 cores (one per node, so
	// cadvisor reports it as a node cache and the kubelet falls back to sockets), SMT.
	{Name: "epyc-2s-4numa", Sockets: 2, NUMAPerSocket: 4, CoresPerNUMA: 4, ThreadsPerCore: 2, CoresPerL3: 4, MemoryBytes: 16 * gib, Huge2Mi: 1024},
	// 8 NUMA nodes (4 sockets x 2), no SMT.
	{Name: "4s-8numa", Sockets: 4, NUMAPerSocket: 2, CoresPerNUMA: 4, ThreadsPerCore: 1, MemoryBytes: 16 * gib},
}

func (s Shape) numaNodes() int { return s.Sockets * s.NUMAPerSocket }
func (s Shape) cores() int     { return s.numaNodes() * s.CoresPerNUMA }
func (s Shape) cpus() int      { return s.cores() * s.ThreadsPerCore }

// core is one physical core: global index, socket, NUMA node, per-socket core_id, L3 id.
type core struct {
	index, socket, node, coreID, l3 int
	threads                         []int
}

func (s Shape) coreList() []core {
	var out []core
	for g := 0; g < s.cores(); g++ {
		node := g / s.CoresPerNUMA
		socket := node / s.NUMAPerSocket
		inSocket := g - socket*s.NUMAPerSocket*s.CoresPerNUMA
		l3 := socket
		if s.CoresPerL3 > 0 {
			l3 = g / s.CoresPerL3
		}
		c := core{index: g, socket: socket, node: node, coreID: inSocket, l3: l3}
		for t := 0; t < s.ThreadsPerCore; t++ {
			c.threads = append(c.threads, t*s.cores()+g)
		}
		out = append(out, c)
	}
	return out
}

func (s Shape) distance(a, b int) uint64 {
	switch {
	case a == b:
		return 10
	case a/s.NUMAPerSocket == b/s.NUMAPerSocket:
		return 12
	default:
		return 32
	}
}

// MachineInfo is what cadvisor reports for the shape: its own sysfs parsing
// (sysinfo.GetNodesInfo, the code machine.Info runs) over the tree WriteSysfs writes, so the
// kubelet and devicelet read one machine. Parsed once per shape; every caller gets a copy.
func (s Shape) MachineInfo() *cadvisorapi.MachineInfo {
	machineInfoLock.Lock()
	defer machineInfoLock.Unlock()
	mi, ok := machineInfos[s.Name]
	if !ok {
		var err error
		mi, err = s.parseMachineInfo()
		if err != nil {
			panic(fmt.Sprintf("shape %s: cadvisor could not read its sysfs tree: %v", s.Name, err))
		}
		machineInfos[s.Name] = mi
	}
	raw, err := json.Marshal(mi)
	if err != nil {
		panic(err)
	}
	out := &cadvisorapi.MachineInfo{}
	if err := json.Unmarshal(raw, out); err != nil {
		panic(err)
	}
	return out
}

var (
	machineInfoLock sync.Mutex
	machineInfos    = map[string]*cadvisorapi.MachineInfo{}
)

func (s Shape) parseMachineInfo() (*cadvisorapi.MachineInfo, error) {
	root, err := os.MkdirTemp("", "rm-sysfs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	if err := s.WriteSysfs(root); err != nil {
		return nil, err
	}
	nodes, threads, err := sysinfo.GetNodesInfo(rootedSysFs{SysFs: sysfs.NewRealSysFs(), root: root})
	if err != nil {
		return nil, err
	}
	// NumPhysicalCores, NumSockets and MemoryCapacity come from /proc in machine.Info; the
	// machine-wide huge pages from /sys/kernel/mm/hugepages (every node's pages).
	mi := &cadvisorapi.MachineInfo{
		NumCores:         threads,
		NumPhysicalCores: s.cores(),
		NumSockets:       s.Sockets,
		MemoryCapacity:   s.MemoryBytes * uint64(s.numaNodes()),
		Topology:         nodes,
		HugePages:        s.hugePages(),
	}
	for i := range mi.HugePages {
		mi.HugePages[i].NumPages *= uint64(s.numaNodes())
	}
	return mi, nil
}

// rootedSysFs is cadvisor's real sysfs reader moved under root. The readers that take a path
// already work there (GetNodesPaths' and GetCPUsPaths' globs, core and package ids, meminfo,
// distance, huge pages); the ones with /sys built in are redone here, reading the same files
// the same way.
type rootedSysFs struct {
	sysfs.SysFs
	root string
}

func (fs rootedSysFs) GetNodesPaths() ([]string, error) {
	return filepath.Glob(filepath.Join(fs.root, "devices/system/node/node*[0-9]"))
}

func (fs rootedSysFs) cacheDir(cpu int) string {
	return filepath.Join(fs.root, fmt.Sprintf("devices/system/cpu/cpu%d/cache", cpu))
}

func (fs rootedSysFs) GetCaches(cpu int) ([]os.FileInfo, error) {
	entries, err := os.ReadDir(fs.cacheDir(cpu))
	if err != nil {
		return nil, err
	}
	var out []os.FileInfo
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

// GetCacheInfo reads id, size (in K), level, type and the shared_cpu_map bit count.
func (fs rootedSysFs) GetCacheInfo(cpu int, name string) (sysfs.CacheInfo, error) {
	dir := filepath.Join(fs.cacheDir(cpu), name)
	read := func(file string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, file))
		return string(b), err
	}
	var info sysfs.CacheInfo
	text, err := read("id")
	if err != nil {
		return info, err
	}
	if _, err := fmt.Sscanf(text, "%d", &info.Id); err != nil {
		return info, err
	}
	if text, err = read("size"); err != nil {
		return info, err
	}
	if _, err := fmt.Sscanf(text, "%dK", &info.Size); err != nil {
		return info, err
	}
	info.Size *= 1024
	if text, err = read("level"); err != nil {
		return info, err
	}
	if _, err := fmt.Sscanf(text, "%d", &info.Level); err != nil {
		return info, err
	}
	if text, err = read("type"); err != nil {
		return info, err
	}
	info.Type = strings.TrimSpace(text)
	if text, err = read("shared_cpu_map"); err != nil {
		return info, err
	}
	for _, word := range strings.Split(text, ",") {
		mask, err := strconv.ParseUint(strings.TrimSpace(word), 16, 64)
		if err != nil {
			return info, fmt.Errorf("shared_cpu_map %q: %w", text, err)
		}
		info.Cpus += bits.OnesCount64(mask)
	}
	return info, nil
}

// IsCPUOnline looks the CPU up in the tree's cpu/online list (everything is online when the
// file is missing).
func (fs rootedSysFs) IsCPUOnline(cpuDir string) bool {
	b, err := os.ReadFile(filepath.Join(fs.root, "devices/system/cpu/online"))
	if os.IsNotExist(err) {
		return true
	}
	if err != nil {
		return false
	}
	online, err := cpuset.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return false
	}
	id, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(cpuDir), "cpu"))
	return err == nil && online.Contains(id)
}

// cpuMask is a CPU set as Linux prints a cpumask (%*pb): 32-bit hex words, most significant
// first, comma separated, the first word only as wide as the bits it holds.
func cpuMask(cpus []int, bitsTotal int) string {
	words := (bitsTotal + 31) / 32
	vals := make([]uint32, words)
	for _, c := range cpus {
		vals[c/32] |= 1 << (c % 32)
	}
	var parts []string
	for w := words - 1; w >= 0; w-- {
		width := 8
		if w == words-1 && bitsTotal%32 != 0 {
			width = (bitsTotal%32 + 3) / 4
		}
		parts = append(parts, fmt.Sprintf("%0*x", width, vals[w]))
	}
	return strings.Join(parts, ",")
}

func (s Shape) hugePages() []cadvisorapi.HugePagesInfo {
	// cadvisor lists every size the kernel supports, present or not.
	return []cadvisorapi.HugePagesInfo{
		{PageSize: 1048576, NumPages: s.Huge1Gi},
		{PageSize: 2048, NumPages: s.Huge2Mi},
	}
}

func cpuList(cpus []int) string {
	sort.Ints(cpus)
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// WriteSysfs writes the shape's sysfs tree under root: what Linux shows in
// /sys/devices/system/{node,cpu}.
func (s Shape) WriteSysfs(root string) error {
	files := map[string]string{}
	cores := s.coreList()
	nodeCPUs := map[int][]int{}
	var all []int
	for _, c := range cores {
		nodeCPUs[c.node] = append(nodeCPUs[c.node], c.threads...)
		all = append(all, c.threads...)
	}
	nodeDir := "devices/system/node"
	var nodes []int
	for n := 0; n < s.numaNodes(); n++ {
		nodes = append(nodes, n)
		d := fmt.Sprintf("%s/node%d", nodeDir, n)
		files[d+"/cpulist"] = cpuList(nodeCPUs[n]) + "\n"
		var row []string
		for m := 0; m < s.numaNodes(); m++ {
			row = append(row, strconv.FormatUint(s.distance(n, m), 10))
		}
		files[d+"/distance"] = strings.Join(row, " ") + "\n"
		kb := s.MemoryBytes / 1024
		files[d+"/meminfo"] = fmt.Sprintf("Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\nNode %d MemUsed:        %d kB\nNode %d HugePages_Total:  %d\n",
			n, kb, n, kb/2, n, kb/2, n, s.Huge2Mi)
		for _, hp := range s.hugePages() {
			h := fmt.Sprintf("%s/hugepages/hugepages-%dkB", d, hp.PageSize)
			files[h+"/nr_hugepages"] = fmt.Sprintf("%d\n", hp.NumPages)
			files[h+"/free_hugepages"] = fmt.Sprintf("%d\n", hp.NumPages)
			files[h+"/surplus_hugepages"] = "0\n"
		}
	}
	files[nodeDir+"/online"] = cpuList(nodes) + "\n"
	files[nodeDir+"/possible"] = cpuList(nodes) + "\n"
	cpuDir := "devices/system/cpu"
	files[cpuDir+"/online"] = cpuList(all) + "\n"
	files[cpuDir+"/possible"] = cpuList(all) + "\n"
	for _, c := range cores {
		var l3 []int
		var pkg []int
		for _, o := range cores {
			if o.l3 == c.l3 {
				l3 = append(l3, o.threads...)
			}
			if o.socket == c.socket {
				pkg = append(pkg, o.threads...)
			}
		}
		for _, cpu := range c.threads {
			d := fmt.Sprintf("%s/cpu%d", cpuDir, cpu)
			files[d+"/online"] = "1\n"
			files[d+"/topology/physical_package_id"] = fmt.Sprintf("%d\n", c.socket)
			files[d+"/topology/core_id"] = fmt.Sprintf("%d\n", c.coreID)
			files[d+"/topology/thread_siblings_list"] = cpuList(append([]int(nil), c.threads...)) + "\n"
			files[d+"/topology/core_siblings_list"] = cpuList(append([]int(nil), pkg...)) + "\n"
			files[d+"/topology/package_cpus_list"] = cpuList(append([]int(nil), pkg...)) + "\n"
			caches := []struct {
				level  int
				typ    string
				id     int
				shared []int
				size   string
			}{
				{1, "Data", c.index, c.threads, "32K"},
				{1, "Instruction", c.index, c.threads, "32K"},
				{2, "Unified", c.index, c.threads, "1024K"},
				{3, "Unified", c.l3, l3, "32768K"},
			}
			for k, cache := range caches {
				cd := fmt.Sprintf("%s/cache/index%d", d, k)
				files[cd+"/level"] = fmt.Sprintf("%d\n", cache.level)
				files[cd+"/type"] = cache.typ + "\n"
				files[cd+"/id"] = fmt.Sprintf("%d\n", cache.id)
				files[cd+"/shared_cpu_list"] = cpuList(append([]int(nil), cache.shared...)) + "\n"
				files[cd+"/shared_cpu_map"] = cpuMask(cache.shared, s.cpus()) + "\n"
				files[cd+"/size"] = cache.size + "\n"
			}
		}
	}
	for path, content := range files {
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			return err
		}
	}
	// Each node directory links its CPUs (node/nodeN/cpuM -> ../../cpu/cpuM); cadvisor walks
	// these.
	for _, c := range cores {
		for _, cpu := range c.threads {
			link := filepath.Join(root, fmt.Sprintf("%s/node%d/cpu%d", nodeDir, c.node, cpu))
			if err := os.Symlink(fmt.Sprintf("../../cpu/cpu%d", cpu), link); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestShapeMachineInfo checks that cadvisor reads each shape's tree as the shape means it:
// every core with its threads and socket, and an uncore cache exactly where an L3 is not
// shared by just the NUMA node's threads (an L3 spanning exactly the node is a node cache,
// and the kubelet then groups the cores by socket).
func TestShapeMachineInfo(t *testing.T) {
	for _, s := range shapes {
		mi := s.MachineInfo()
		if mi.NumCores != s.cpus() || len(mi.Topology) != s.numaNodes() {
			t.Fatalf("%s: %d CPUs in %d nodes, want %d in %d", s.Name, mi.NumCores, len(mi.Topology), s.cpus(), s.numaNodes())
		}
		want := map[int]core{}
		for _, c := range s.coreList() {
			for _, cpu := range c.threads {
				want[cpu] = c
			}
		}
		l3Cores := s.CoresPerL3
		if l3Cores == 0 {
			l3Cores = s.NUMAPerSocket * s.CoresPerNUMA
		}
		l3Node := l3Cores == s.CoresPerNUMA
		for _, node := range mi.Topology {
			if len(node.Cores) != s.CoresPerNUMA {
				t.Errorf("%s node %d: %d cores", s.Name, node.Id, len(node.Cores))
			}
			for _, got := range node.Cores {
				c, ok := want[got.Threads[0]]
				if !ok || c.node != node.Id || c.socket != got.SocketID || c.coreID != got.Id || cpuList(append([]int(nil), got.Threads...)) != cpuList(append([]int(nil), c.threads...)) {
					t.Errorf("%s node %d: unexpected core %+v", s.Name, node.Id, got)
					continue
				}
				switch {
				case l3Node && len(got.UncoreCaches) != 0:
					t.Errorf("%s core %v: uncore caches %+v, want none", s.Name, got.Threads, got.UncoreCaches)
				case !l3Node && (len(got.UncoreCaches) != 1 || got.UncoreCaches[0].Id != c.l3):
					t.Errorf("%s core %v: uncore caches %+v, want L3 %d", s.Name, got.Threads, got.UncoreCaches, c.l3)
				}
			}
			if l3Node && len(node.Caches) != 1 {
				t.Errorf("%s node %d: node caches %+v", s.Name, node.Id, node.Caches)
			}
		}
	}
}
