package resourcemanagers

// Machine shapes from real hardware, written both as the sysfs tree devicelet reads
// (crates/devicelet-machine) and as the cadvisor MachineInfo the kubelet's
// cpumanager/topology.Discover, Topology Manager and Memory Manager read.

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	cadvisorapi "github.com/google/cadvisor/info/v1"
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
	// AMD EPYC NPS4, 1 socket x 4 NUMA, L3 per 8 cores (CCX), SMT.
	{Name: "epyc-1s-4numa", Sockets: 1, NUMAPerSocket: 4, CoresPerNUMA: 8, ThreadsPerCore: 2, CoresPerL3: 8, MemoryBytes: 32 * gib, Huge1Gi: 8},
	// AMD EPYC NPS4, 2 sockets x 4 NUMA, L3 per 4 cores, SMT.
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

// MachineInfo is what cadvisor reports for the shape.
func (s Shape) MachineInfo() *cadvisorapi.MachineInfo {
	mi := &cadvisorapi.MachineInfo{
		NumCores:         s.cpus(),
		NumPhysicalCores: s.cores(),
		NumSockets:       s.Sockets,
		MemoryCapacity:   s.MemoryBytes * uint64(s.numaNodes()),
	}
	cores := s.coreList()
	for n := 0; n < s.numaNodes(); n++ {
		node := cadvisorapi.Node{Id: n, Memory: s.MemoryBytes, HugePages: s.hugePages()}
		for m := 0; m < s.numaNodes(); m++ {
			node.Distances = append(node.Distances, s.distance(n, m))
		}
		for _, c := range cores {
			if c.node != n {
				continue
			}
			node.Cores = append(node.Cores, cadvisorapi.Core{
				Id:           c.coreID,
				Threads:      append([]int(nil), c.threads...),
				SocketID:     c.socket,
				UncoreCaches: []cadvisorapi.Cache{{Id: c.l3, Size: 32 << 20, Type: "Unified", Level: 3}},
			})
		}
		mi.Topology = append(mi.Topology, node)
	}
	mi.HugePages = s.hugePages()
	for i := range mi.HugePages {
		mi.HugePages[i].NumPages *= uint64(s.numaNodes())
	}
	return mi
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
	return nil
}
