package cluster

// Many nodes on one machine: N devicelet processes, each with its own root, node identity and
// example plugin, against the same control plane. Pods go from creation to Running through the
// real kube-scheduler; the test reports pods/s, devicelet's own admission time (p50/p99, from each
// node's "pod admitted ... admission_ms" log line) and RSS/CPU per devicelet process.
//
//   CLUSTER_SCALE_NODES=100 CLUSTER_SCALE_DEVICES=8 CLUSTER_SCALE_PODS=1000 \
//     DEVICELET_BIN=$PWD/target/release/devicelet bash interop/cluster/run.sh -run TestScale -v
//
// CI runs a small instance (the defaults) so that the path stays exercised.

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// procStats reads a process's private resident memory (RssAnon: heap and stacks, what each
// extra node costs; the binary's text pages are shared by every devicelet) and user+system CPU
// time.
func procStats(pid int) (rss int64, cpu time.Duration) {
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "RssAnon:") {
				f := strings.Fields(line)
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				rss = kb * 1024
			}
		}
	}
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// Fields after the command name (which may hold spaces) start after the last ')'.
		f := strings.Fields(string(data)[strings.LastIndexByte(string(data), ')')+2:])
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		cpu = time.Duration(utime+stime) * (time.Second / 100) // USER_HZ is 100 on Linux
	}
	return rss, cpu
}

// admissionTimes collects admission_ms from a devicelet log.
func admissionTimes(output string) []float64 {
	var out []float64
	for _, line := range strings.Split(output, "\n") {
		if !strings.Contains(line, "devicelet_kube::pods: pod admitted pod=") {
			continue
		}
		if i := strings.Index(line, "admission_ms="); i >= 0 {
			if v, err := strconv.ParseFloat(strings.Fields(line[i+len("admission_ms="):])[0], 64); err == nil {
				out = append(out, v)
			}
		}
	}
	return out
}

// startupStages are the fields of devicelet's "pod start-up stages" debug line (one per admitted
// pod, target devicelet_kube::startup): the stages in order, then the whole span from the node
// first seeing the bound pod to its Running status written, that span without the DRA
// drivers' and device plugins' own time (devicelet's share), and the attempts the admission
// took (more than 1: a claim was not usable yet).
var startupStages = []string{"claim_wait_ms", "claim_get_ms", "driver_prepare_ms", "plugin_allocate_ms", "checkpoint_write_ms", "admission_ms", "status_write_ms", "total_ms", "own_ms", "attempts"}

// startupTable collects every node's start-up records, checks that there is one per pod and
// that the stages add up to the whole span, and returns a table of p50/p99/max per field and
// the sorted own_ms values.
func startupTable(t *testing.T, all []*node, pods int) (string, []float64) {
	t.Helper()
	fields := map[string][]float64{}
	for _, n := range all {
		out := n.devicelet.output.String()
		for _, f := range startupStages {
			fields[f] = append(fields[f], logField(out, "pod start-up stages", f)...)
		}
		// Each record's stages add up to its total (rounding aside).
		for _, line := range strings.Split(out, "\n") {
			if !strings.Contains(line, "pod start-up stages") {
				continue
			}
			sum, total := 0.0, logField(line, "pod start-up stages", "total_ms")
			for _, f := range startupStages[:7] {
				sum += logField(line, "pod start-up stages", f)[0]
			}
			if len(total) != 1 || sum < total[0]-0.01 || sum > total[0]+0.01 {
				t.Fatalf("stages of %q do not add up to total_ms", line)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-20s %10s %10s %10s\n", "stage (ms)", "p50", "p99", "max")
	for _, f := range startupStages {
		v := fields[f]
		if len(v) != pods {
			t.Fatalf("%d start-up records carry %s, want %d (one per pod)", len(v), f, pods)
		}
		sort.Float64s(v)
		fmt.Fprintf(&b, "%-20s %10.2f %10.2f %10.2f\n", strings.TrimSuffix(f, "_ms"), quantile(v, 0.5), quantile(v, 0.99), v[len(v)-1])
	}
	return b.String(), fields["own_ms"]
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func TestScaleManyNodes(t *testing.T) {
	nodes := envInt("CLUSTER_SCALE_NODES", 5)
	devices := envInt("CLUSTER_SCALE_DEVICES", 8)
	pods := envInt("CLUSTER_SCALE_PODS", 60)
	ns := namespace(t, "scale")

	started := time.Now()
	var all []*node
	for i := 0; i < nodes; i++ {
		n := startNode(t, fmt.Sprintf("scale-%03d", i))
		n.plugin(t, "--devices", itoa(devices))
		all = append(all, n)
	}
	for _, n := range all {
		waitForResource(t, n.name, gpu, int64(devices), int64(devices))
	}
	t.Logf("%d nodes x %d devices registered and Ready in %s", nodes, devices, time.Since(started).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // let start-up work settle before the idle reading
	var idleRSS []float64
	cpuBefore := map[int]time.Duration{}
	for _, n := range all {
		rss, cpu := procStats(n.devicelet.cmd.Process.Pid)
		idleRSS = append(idleRSS, mib(rss))
		cpuBefore[n.devicelet.cmd.Process.Pid] = cpu
	}
	sort.Float64s(idleRSS)

	// Pods in waves as large as the cluster's devices allow.
	running := runWaves(t, ns, "wave", pods, nodes*devices, 15*time.Minute,
		func(name string, size int) { createDeploymentAnyNode(t, ns, name, int32(size)) },
		func(name string) (bool, string) {
			phases, items := podPhases(t, ns, name)
			return len(items) == 0 && phases["list error"] == "", fmt.Sprint(len(items), " pods left ", phases["list error"])
		})

	var times []float64
	var busyRSS []float64
	var cpus []float64
	for _, n := range all {
		times = append(times, admissionTimes(n.devicelet.output.String())...)
		pid := n.devicelet.cmd.Process.Pid
		rss, cpu := procStats(pid)
		busyRSS = append(busyRSS, mib(rss))
		cpus = append(cpus, (cpu - cpuBefore[pid]).Seconds())
	}
	sort.Float64s(times)
	sort.Float64s(busyRSS)
	sort.Float64s(cpus)
	if len(times) != pods {
		t.Fatalf("%d admissions logged, want %d", len(times), pods)
	}
	t.Logf("SCALE nodes=%d devices/node=%d pods=%d: %.1f pods/s creation->Running; devicelet admission p50 %.2f ms p99 %.2f ms max %.2f ms; private RSS (RssAnon) per devicelet idle median %.1f MiB max %.1f MiB, after the pods median %.1f MiB max %.1f MiB; CPU per devicelet during the pods median %.2f s max %.2f s",
		nodes, devices, pods, float64(pods)/running.Seconds(),
		quantile(times, 0.5), quantile(times, 0.99), times[len(times)-1],
		quantile(idleRSS, 0.5), idleRSS[len(idleRSS)-1], quantile(busyRSS, 0.5), busyRSS[len(busyRSS)-1],
		quantile(cpus, 0.5), cpus[len(cpus)-1])
	table, _ := startupTable(t, all, pods)
	t.Logf("SCALE start-up stages per pod (node first sees it bound -> Running written):\n%s", table)
	// No device held twice, none leaked: every node is back to all devices free.
	for _, n := range all {
		if held := podResources(t, n); len(held) != 0 {
			t.Fatalf("node %s still holds %v after every pod was deleted", n.name, held)
		}
	}
}

// createDeploymentAnyNode is createDeployment without a node selector: the scheduler spreads the
// pods over every node with a free device.
func createDeploymentAnyNode(t *testing.T, ns, name string, replicas int32) {
	t.Helper()
	createDeployment(t, ns, name, "", replicas, 1)
}

// runWaves creates `pods` pods in Deployments of at most `capacity` (create(name, size)); each
// wave is waited for Running (at most `wait`), then deleted and waited for until gone(name)
// holds, before the next. It returns the time from creation to Running, summed over the waves.
func runWaves(t *testing.T, ns, prefix string, pods, capacity int, wait time.Duration,
	create func(name string, size int), gone func(name string) (bool, string)) time.Duration {
	t.Helper()
	var running time.Duration
	for wave, done := 0, 0; done < pods; wave++ {
		size := min(capacity, pods-done)
		name := fmt.Sprintf("%s-%d", prefix, wave)
		createdAt := time.Now()
		create(name, size)
		waitForRunning(t, ns, name, size, wait)
		elapsed := time.Since(createdAt)
		running += elapsed
		t.Logf("%s: %d pods created -> Running in %s (%.1f pods/s)", name, size, elapsed.Round(time.Millisecond), float64(size)/elapsed.Seconds())
		if err := controlPlane.admin.AppsV1().Deployments(ns).Delete(ctx(t), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForEvery(t, 15*time.Minute, time.Second, name+" deleted", func() (bool, string) { return gone(name) })
		done += size
	}
	return running
}
