package resourcemanagers

// The comparison: every case runs through the kubelet's managers (kubelet_test.go) and
// through `devicelet resources replay` (a few batches in parallel), then each step's
// decision, CPU sets, NUMA affinities, memory blocks and state files are compared.
//
// RM_AREAS=cpu,cpu-options,memory,podlevel (default: the areas that pass): cpu is the Topology
// Manager (every policy, scope and option) with the CPU Manager's none and static policies and
// the reserved CPUs; cpu-options adds subsets of the static policy's options; memory adds the
// Memory Manager's static policy with reservedMemory and hugepages. podlevel (KEP-5526) is a
// run of its own (subtest podlevel, RM_PODLEVEL_SEQUENCES=N, default 1500, so that over 1000
// run with both gates on): pods with pod-level
// resources mixed with ordinary ones, the gates PodLevelResources and PodLevelResourceManagers
// on in most cases, the Memory Manager in half. RM_SEQUENCES=N (default 1000), RM_SEED=S
// (default fixed; `random` draws one), RM_KEEP=1 keeps the work directory.

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/cpuset"
)

// defaultAreas is what CI runs: the areas where devicelet matches the kubelet.
const defaultAreas = "cpu,cpu-options,memory,podlevel"

// StepResult is one step's outcome, in `devicelet resources replay`'s JSON.
type StepResult struct {
	Admitted           bool              `json:"admitted"`
	Reason             string            `json:"reason"`
	Message            string            `json:"message"`
	Containers         []ContainerResult `json:"containers"`
	CPUManagerState    *string           `json:"cpuManagerState"`
	MemoryManagerState *string           `json:"memoryManagerState"`
}

type ContainerResult struct {
	Name         string        `json:"name"`
	CPUs         string        `json:"cpus"`
	NUMAAffinity []int         `json:"numaAffinity"`
	Memory       []MemoryBlock `json:"memory"`
}

type MemoryBlock struct {
	NUMAAffinity []int  `json:"numaAffinity"`
	Type         string `json:"type"`
	Size         uint64 `json:"size"`
}

// Replay is one sequence's outcome.
type Replay struct {
	ConfigError        *string      `json:"configError"`
	Steps              []StepResult `json:"steps"`
	CPUManagerState    *string      `json:"cpuManagerState"`
	MemoryManagerState *string      `json:"memoryManagerState"`
	MemoryManager      bool         `json:"memoryManager"`
}

// knownDivergences: places where devicelet differs from the kubelet on purpose. Each entry
// says why; match decides whether a difference found at a step is that one.
var knownDivergences = []struct {
	name, reason string
	match        func(c *Case, step int, kube, dl *StepResult, what string) bool
}{
	// None so far. Two upstream behaviours are handled where they arise instead of skipped
	// here: the kubelet's late clean-up of a rejected pod (kubeletNode.admit frees it at the
	// same point as devicelet), and the random order of a container's memory blocks in the
	// kubelet's memory_manager_state (normBlocks, sameMemoryStateButBlockOrder).
}

func TestMain(m *testing.M) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("alsologtostderr", "false")
	_ = fs.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	os.Exit(m.Run())
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

func TestResourceManagers(t *testing.T) {
	bin := os.Getenv("DEVICELET_BIN")
	if bin == "" {
		t.Skip("DEVICELET_BIN is not set")
	}
	areasText := os.Getenv("RM_AREAS")
	if areasText == "" {
		areasText = defaultAreas
	}
	areas := map[string]bool{}
	podlevel := false
	for _, a := range strings.Split(areasText, ",") {
		a = strings.TrimSpace(a)
		if a == "podlevel" {
			podlevel = true
			continue
		}
		if a != "" {
			areas[a] = true
		}
	}
	seed := int64(20260601)
	if v := os.Getenv("RM_SEED"); v == "random" {
		seed = time.Now().UnixNano()
	} else if v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("RM_SEED=%q", v)
		}
		seed = s
	}
	if len(areas) > 0 {
		n := envInt("RM_SEQUENCES", 1000)
		t.Logf("RM_SEED=%d RM_SEQUENCES=%d RM_AREAS=%s", seed, n, areasText)
		runSuite(t, bin, areas, n, seed)
	}
	if podlevel {
		t.Run("podlevel", func(t *testing.T) {
			n := envInt("RM_PODLEVEL_SEQUENCES", 1500)
			t.Logf("RM_SEED=%d RM_PODLEVEL_SEQUENCES=%d", seed, n)
			runSuite(t, bin, map[string]bool{"podlevel": true}, n, seed)
		})
	}
}

// runSuite generates n cases for the areas from the seed, replays them on both sides and
// compares them.
func runSuite(t *testing.T, bin string, areas map[string]bool, n int, seed int64) {
	work, err := os.MkdirTemp("", "resourcemanagers-")
	if err != nil {
		t.Fatal(err)
	}
	keep := os.Getenv("RM_KEEP") != ""
	defer func() {
		if !keep && !t.Failed() {
			os.RemoveAll(work)
		} else {
			t.Logf("work directory kept: %s", work)
		}
	}()
	sysfs := map[string]string{}
	for _, s := range shapes {
		dir := filepath.Join(work, "sysfs", s.Name)
		if err := s.WriteSysfs(dir); err != nil {
			t.Fatal(err)
		}
		sysfs[s.Name] = dir
	}

	r := rand.New(rand.NewSource(seed))
	cases := make([]*Case, n)
	for i := range cases {
		cases[i] = genCase(r, i, areas)
	}

	start := time.Now()
	var dlResults []Replay
	var dlErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		dlResults, dlErr = runDevicelet(bin, work, cases, sysfs)
	}()
	// The kubelet side in a few goroutines: the state files are written with fsync, so the
	// time is mostly waiting. Only building a node reads the feature gates it sets
	// (newKubeletNode holds buildLock).
	// The pod-level gates are read while pods are admitted, not only when a node is built, so
	// the cases run in groups that share them (one group outside the podlevel area).
	kubeResults := make([]Replay, n)
	groups := map[string][]int{}
	var keys []string
	for i, c := range cases {
		k := podLevelGateKey(c)
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], i)
	}
	for _, k := range keys {
		var kwg sync.WaitGroup
		next := make(chan int)
		for w := 0; w < 4; w++ {
			kwg.Add(1)
			go func() {
				defer kwg.Done()
				for i := range next {
					kubeResults[i] = runKubelet(cases[i], filepath.Join(work, "kubelet", strconv.Itoa(i)))
				}
			}()
		}
		for _, i := range groups[k] {
			next <- i
		}
		close(next)
		kwg.Wait()
	}
	kubeTime := time.Since(start)
	wg.Wait()
	t.Logf("kubelet side %v, both sides %v", kubeTime.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if dlErr != nil {
		t.Fatal(dlErr)
	}

	// What the cases exercised (so a run that tests little shows it).
	stats := map[string]int{}
	for i, k := range kubeResults {
		if k.ConfigError != nil {
			stats["refused configs"]++
			continue
		}
		if cases[i].FeatureGates["PodLevelResources"] && cases[i].FeatureGates["PodLevelResourceManagers"] {
			stats["sequences with the pod-level gates on"]++
		}
		for j, s := range k.Steps {
			switch {
			case cases[i].Steps[j].Remove != "":
				stats["removals"]++
			case s.Admitted:
				stats["admitted pods"]++
				if cases[i].Steps[j].Admit.Spec.Resources != nil {
					stats["admitted pods with pod-level resources"]++
				}
				if s.CPUManagerState != nil && strings.Contains(*s.CPUManagerState, `"podEntries"`) {
					stats["steps with cpu podEntries"]++
				}
				if s.MemoryManagerState != nil && strings.Contains(*s.MemoryManagerState, `"podEntries"`) {
					stats["steps with memory podEntries"]++
				}
				for _, c := range s.Containers {
					if c.CPUs != "" {
						stats["containers with exclusive CPUs"]++
					}
					if len(c.Memory) > 0 {
						stats["containers with memory blocks"]++
					}
				}
			default:
				stats["rejected pods ("+s.Reason+")"]++
			}
		}
	}
	t.Logf("kubelet outcomes: %v", stats)

	mismatches := 0
	counts := map[string]int{}
	known := map[string]int{}
	for i, c := range cases {
		what, step, detail, knownName := compare(c, &kubeResults[i], &dlResults[i], areas)
		if what == "" {
			continue
		}
		if knownName != "" {
			known[knownName]++
			continue
		}
		mismatches++
		counts[what]++
		if mismatches <= 10 {
			dir := saveCase(t, work, "mismatch", c, &kubeResults[i], &dlResults[i], sysfs)
			t.Errorf("case %d (seed %d): step %d: %s: %s\n  %s\n  files: %s", i, seed, step, what, detail, caseLine(c), dir)
			// A minimal reproducer for the first few (RM_SHRINK=0 turns it off).
			if counts[what] <= 2 && os.Getenv("RM_SHRINK") != "0" {
				m := shrink(bin, work, c, what, areas, sysfs)
				mk := runKubelet(m, filepath.Join(work, "min-kubelet", strconv.Itoa(i)))
				md, err := replayBatch(bin, filepath.Join(work, "min-devicelet", strconv.Itoa(i)), []*Case{m}, sysfs)
				if err == nil {
					_, mstep, mdetail, _ := compare(m, &mk, &md[0], areas)
					mdir := saveCase(t, work, "minimal", m, &mk, &md[0], sysfs)
					t.Logf("  minimal reproducer of case %d: %s\n    %s\n    step %d: %s\n    files: %s", i, caseLine(m), describe(m), mstep, mdetail, mdir)
				}
			}
		}
	}
	for name, k := range known {
		t.Logf("known divergence %s: %d sequences", name, k)
	}
	if mismatches > 0 {
		t.Errorf("%d of %d sequences differ (by first difference: %v); seed %d", mismatches, n, counts, seed)
	}
}

// podLevelGateKey: the values a case gives the gates that the managers read at admission.
func podLevelGateKey(c *Case) string {
	k := ""
	for _, g := range []string{"PodLevelResources", "PodLevelResourceManagers"} {
		if v, ok := c.FeatureGates[g]; ok {
			k += fmt.Sprintf("%s=%v,", g, v)
		}
	}
	return k
}

// runKubelet replays a case through the kubelet's managers.
func runKubelet(c *Case, dir string) Replay {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		panic(err)
	}
	node, err := newKubeletNode(c, dir)
	if err != nil {
		msg := err.Error()
		return Replay{ConfigError: &msg}
	}
	var out Replay
	for _, s := range c.Steps {
		var res StepResult
		if s.Admit != nil {
			res = node.admit(s.Admit.DeepCopy())
		} else {
			res = node.remove(s.Remove)
		}
		res.CPUManagerState = readState(dir, "cpu_manager_state")
		res.MemoryManagerState = readState(dir, "memory_manager_state")
		out.Steps = append(out.Steps, res)
	}
	out.CPUManagerState = readState(dir, "cpu_manager_state")
	out.MemoryManagerState = readState(dir, "memory_manager_state")
	out.MemoryManager = node.mem != nil
	return out
}

func readState(dir, name string) *string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil
	}
	s := string(b)
	return &s
}

type batchSequence struct {
	Config map[string]any `json:"config"`
	Steps  []Step         `json:"steps"`
}

// runDevicelet replays the cases through devicelet in a few parallel batches.
func runDevicelet(bin, work string, cases []*Case, sysfs map[string]string) ([]Replay, error) {
	workers := runtime.NumCPU()
	if workers > 4 {
		workers = 4
	}
	if workers > len(cases) {
		workers = len(cases)
	}
	if workers < 1 {
		return nil, nil
	}
	out := make([]Replay, len(cases))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		lo, hi := w*len(cases)/workers, (w+1)*len(cases)/workers
		wg.Add(1)
		go func(w, lo, hi int) {
			defer wg.Done()
			results, err := replayBatch(bin, filepath.Join(work, "devicelet", strconv.Itoa(w)), cases[lo:hi], sysfs)
			if err != nil {
				errs[w] = err
				return
			}
			copy(out[lo:hi], results)
		}(w, lo, hi)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func replayBatch(bin, dir string, cases []*Case, sysfs map[string]string) ([]Replay, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var batch struct {
		Sequences []batchSequence `json:"sequences"`
	}
	for _, c := range cases {
		batch.Sequences = append(batch.Sequences, batchSequence{Config: c.KubeletConfig(sysfs[c.Shape.Name]), Steps: c.Steps})
	}
	file := filepath.Join(dir, "batch.json")
	b, err := json.Marshal(batch)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "resources", "replay", "-f", file, "--state-dir", filepath.Join(dir, "state"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("devicelet resources replay %s: %v\n%s", file, err, stderr.String())
	}
	var res struct {
		Sequences []Replay `json:"sequences"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("devicelet output: %v", err)
	}
	if len(res.Sequences) != len(cases) {
		return nil, fmt.Errorf("devicelet answered %d sequences for %d", len(res.Sequences), len(cases))
	}
	return res.Sequences, nil
}

// compare finds the first difference: what kind, at which step, the detail, and the known
// divergence it is (if any). Steps after the first difference are not compared (they follow
// from it).
func compare(c *Case, kube, dl *Replay, areas map[string]bool) (string, int, string, string) {
	if (kube.ConfigError == nil) != (dl.ConfigError == nil) {
		return "config", -1, fmt.Sprintf("kubelet error %v, devicelet error %v", str(kube.ConfigError), str(dl.ConfigError)), ""
	}
	if kube.ConfigError != nil {
		return "", 0, "", ""
	}
	memory := (areas["memory"] || (areas["podlevel"] && kube.MemoryManager)) && dl.MemoryManager
	if len(kube.Steps) != len(dl.Steps) {
		return "steps", -1, fmt.Sprintf("kubelet %d steps, devicelet %d", len(kube.Steps), len(dl.Steps)), ""
	}
	for i := range kube.Steps {
		k, d := &kube.Steps[i], &dl.Steps[i]
		what, detail := compareStep(c.Steps[i], k, d, memory)
		if what == "" {
			continue
		}
		for _, kd := range knownDivergences {
			if kd.match(c, i, k, d, what) {
				return what, i, detail, kd.name
			}
		}
		return what, i, detail, ""
	}
	return "", 0, "", ""
}

func compareStep(s Step, k, d *StepResult, memory bool) (string, string) {
	if s.Admit != nil {
		if k.Admitted != d.Admitted {
			return "admission", fmt.Sprintf("kubelet admitted=%v (%s: %s), devicelet admitted=%v (%s: %s)", k.Admitted, k.Reason, k.Message, d.Admitted, d.Reason, d.Message)
		}
		if !k.Admitted && k.Reason != d.Reason {
			return "reason", fmt.Sprintf("kubelet %s (%s), devicelet %s (%s)", k.Reason, k.Message, d.Reason, d.Message)
		}
		if len(k.Containers) != len(d.Containers) {
			return "containers", fmt.Sprintf("kubelet %d containers, devicelet %d", len(k.Containers), len(d.Containers))
		}
		for j := range k.Containers {
			kc, dc := k.Containers[j], d.Containers[j]
			if kc.Name != dc.Name {
				return "containers", fmt.Sprintf("container %d: kubelet %s, devicelet %s", j, kc.Name, dc.Name)
			}
			if !sameCPUs(kc.CPUs, dc.CPUs) {
				return "cpus", fmt.Sprintf("container %s: kubelet %q, devicelet %q", kc.Name, kc.CPUs, dc.CPUs)
			}
			if !reflect.DeepEqual(nilIfEmpty(kc.NUMAAffinity), nilIfEmpty(dc.NUMAAffinity)) {
				return "affinity", fmt.Sprintf("container %s: kubelet %v, devicelet %v", kc.Name, kc.NUMAAffinity, dc.NUMAAffinity)
			}
			if memory && !reflect.DeepEqual(normBlocks(kc.Memory), normBlocks(dc.Memory)) {
				return "memory", fmt.Sprintf("container %s: kubelet %+v, devicelet %+v", kc.Name, kc.Memory, dc.Memory)
			}
		}
	}
	if str(k.CPUManagerState) != str(d.CPUManagerState) {
		return "cpu_manager_state", fmt.Sprintf("kubelet %s\n  devicelet %s", str(k.CPUManagerState), str(d.CPUManagerState))
	}
	if memory && str(k.MemoryManagerState) != str(d.MemoryManagerState) && !sameMemoryStateButBlockOrder(k.MemoryManagerState, d.MemoryManagerState) {
		return "memory_manager_state", fmt.Sprintf("kubelet %s\n  devicelet %s", str(k.MemoryManagerState), str(d.MemoryManagerState))
	}
	return "", ""
}

func sameCPUs(a, b string) bool {
	if a == b {
		return true
	}
	x, err1 := cpuset.Parse(a)
	y, err2 := cpuset.Parse(b)
	return err1 == nil && err2 == nil && x.Equals(y)
}

func nilIfEmpty(x []int) []int {
	if len(x) == 0 {
		return nil
	}
	return x
}

// normBlocks orders a container's blocks by type: the kubelet's static policy appends them
// in Go map order (policy_static.go Allocate ranges over the requested resources), which
// changes from run to run.
func normBlocks(b []MemoryBlock) []MemoryBlock {
	if len(b) == 0 {
		return nil
	}
	out := append([]MemoryBlock(nil), b...)
	sort.Slice(out, func(i, j int) bool { return out[i].Type < out[j].Type })
	return out
}

// sameMemoryStateButBlockOrder: the two memory_manager_state files differ only in the order of
// some container's blocks (and so in the checksum). The kubelet writes a container's blocks in
// Go map order, so its own file changes from run to run for a container with memory and huge
// pages; devicelet writes them in one order. Everything else (machine state, entries, block
// contents) must be equal; a file whose blocks are in the same order as the kubelet's is
// compared byte for byte, checksum included.
func sameMemoryStateButBlockOrder(k, d *string) bool {
	if k == nil || d == nil {
		return false
	}
	norm := func(text string) (string, bool) {
		var v map[string]any
		if err := json.Unmarshal([]byte(text), &v); err != nil {
			return "", false
		}
		delete(v, "checksum")
		byType := func(blocks any) {
			bs, _ := blocks.([]any)
			sort.Slice(bs, func(i, j int) bool {
				bi, _ := bs[i].(map[string]any)
				bj, _ := bs[j].(map[string]any)
				return fmt.Sprint(bi["type"]) < fmt.Sprint(bj["type"])
			})
		}
		entries, _ := v["entries"].(map[string]any)
		for _, containers := range entries {
			cs, _ := containers.(map[string]any)
			for _, blocks := range cs {
				byType(blocks)
			}
		}
		// podEntries (PodLevelResourceManagers): the pod's blocks, also in Go map order.
		pods, _ := v["podEntries"].(map[string]any)
		for _, entry := range pods {
			e, _ := entry.(map[string]any)
			byType(e["memoryBlocks"])
		}
		b, err := json.Marshal(v)
		return string(b), err == nil
	}
	nk, ok1 := norm(*k)
	nd, ok2 := norm(*d)
	return ok1 && ok2 && nk == nd
}

func str(s *string) string {
	if s == nil {
		return "<none>"
	}
	return strings.TrimSpace(*s)
}

// saveCase writes a failing case where it can be replayed by hand: the devicelet config,
// the sequence (`devicelet resources replay --config config.json -f seq.json`), both results.
func saveCase(t *testing.T, work, kind string, c *Case, kube, dl *Replay, sysfs map[string]string) string {
	dir := filepath.Join(work, kind, strconv.Itoa(c.Index))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, v any) {
		b, _ := json.MarshalIndent(v, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("config.json", c.KubeletConfig(sysfs[c.Shape.Name]))
	write("seq.json", map[string]any{"steps": c.Steps})
	write("case.json", c)
	write("kubelet.json", kube)
	write("devicelet.json", dl)
	return dir
}

func caseLine(c *Case) string {
	return fmt.Sprintf("shape %s, topology %s/%s %v, cpu %s %v gates %v, reservedSystemCPUs %q kubeReserved %v systemReserved %v",
		c.Shape.Name, c.TopologyPolicy, c.TopologyScope, c.TopologyOptions, c.CPUPolicy, c.CPUOptions, c.FeatureGates,
		c.ReservedSystemCPUs, c.KubeReserved, c.SystemReserved)
}
