package cluster

// Issue 37's benchmark: gangs of DRA pods, kube-scheduler v1.36.3 (GenericWorkload,
// GangScheduling on) and `devicelet scheduler` on the same shapes in the same run. Nodes are API
// objects with one slice of 10 devices each (benchNodes); every PodGroup is a gang of M pods
// (minCount M), each pod with one template claim; members are created interleaved across groups,
// so a scheduler that ignores groups binds them partially. Every decider gets its own node set,
// driver and namespace; pods and claims exist before it starts.
//
// Figures per decider: pods/s over the second half of the bindings, start to last binding, time
// from a group's last member created to its last member bound (p50/p99: all members exist before
// the start, so from the start), the group decision's p99 (scheduler_podgroup_scheduling_
// algorithm_duration_seconds), groups partly bound (must be 0), devices allocated twice (0),
// and, when groups must wait, the decider's CPU while they wait.
//
// Run with SCHEDULER_GANG_BENCH=1 (not part of CI):
//
//	GANG_BENCH_NODES    nodes per decider (default 80: 800 devices)
//	GANG_BENCH_GROUPS   groups (default 100)
//	GANG_BENCH_SIZE     pods per group (default 8)
//	GANG_BENCH_ONLY     ceiling,kube,devicelet subset (ceiling: a binder that decides nothing and
//	                    writes what a scheduler writes, the API server's own ceiling)
//	GANG_BENCH_RACKS    R > 0: nodes labelled devicelet.dev/rack=rack-<i mod R>, every group
//	                    with that topology key (all members inside one rack)
//	GANG_BENCH_CLAIM    "pod" (default: one template claim per pod) or "group": one PodGroup
//	                    claim per group (spec.resourceClaims, DRAWorkloadResourceClaims), one
//	                    device shared by every member (no ceiling: its writes differ)

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// cpuSeconds is the user+system CPU time of process pid so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces) start after the last ')'.
	fields := strings.Fields(string(data)[strings.LastIndexByte(string(data), ')')+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// benchGangPods creates groups g0..g<groups-1> of `size` members for `scheduler` in ns, members
// interleaved, and waits for their claims.
func benchGangPods(t *testing.T, c kubernetes.Interface, ns, set, scheduler string, groups, size int, topologyKey string, groupClaim bool) {
	t.Helper()
	var names []string
	for g := 0; g < groups; g++ {
		names = append(names, fmt.Sprintf("g%d", g))
		pg := &schedulingv1alpha2.PodGroup{
			ObjectMeta: metav1.ObjectMeta{Name: names[g], Namespace: ns},
			Spec: schedulingv1alpha2.PodGroupSpec{
				SchedulingPolicy: schedulingv1alpha2.PodGroupSchedulingPolicy{
					Gang: &schedulingv1alpha2.GangSchedulingPolicy{MinCount: int32(size)},
				},
			},
		}
		if topologyKey != "" {
			pg.Spec.SchedulingConstraints = &schedulingv1alpha2.PodGroupSchedulingConstraints{
				Topology: []schedulingv1alpha2.TopologyConstraint{{Key: topologyKey}},
			}
		}
		if groupClaim {
			pg.Spec.ResourceClaims = []schedulingv1alpha2.PodGroupResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}}
		}
		if _, err := c.SchedulingV1alpha2().PodGroups(ns).Create(ctx(t), pg, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create PodGroup %s: %v", names[g], err)
		}
	}
	err := parallel(groups*size, 32, func(i int) error {
		g, m := i%groups, i/groups
		spec := podSpec("", 0)
		spec.SchedulerName = scheduler
		usePodClaim(&spec, "gpu", "")
		if groupClaim {
			// The same entry as the PodGroup's: the group's one claim (W41).
			spec.ResourceClaims[0].ResourceClaimTemplateName = ptr.To("gpu")
		}
		spec.NodeSelector = map[string]string{"devicelet.dev/bench": set}
		spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(names[g])}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", names[g], m), Namespace: ns}, Spec: spec}
		_, err := c.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitForPodClaims(t, c, ns, groups*size, 900*time.Second)
}

// gangAudit counts whole and partly bound groups and devices allocated twice in ns.
func gangAudit(t *testing.T, c kubernetes.Interface, ns string, size int) (whole, partial, twice int) {
	t.Helper()
	bound, _, err := groupsBound(t, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range bound {
		switch {
		case n == size:
			whole++
		case n != 0:
			partial++
		}
	}
	claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			k := r.Driver + "/" + r.Pool + "/" + r.Device
			if seen[k] {
				twice++
			}
			seen[k] = true
		}
	}
	return whole, partial, twice
}

func TestSchedulerGangsBesideKubeScheduler(t *testing.T) {
	if os.Getenv("SCHEDULER_GANG_BENCH") == "" {
		t.Skip("set SCHEDULER_GANG_BENCH=1 to run the gang comparison")
	}
	nodes := envInt("GANG_BENCH_NODES", 80)
	groups := envInt("GANG_BENCH_GROUPS", 100)
	size := envInt("GANG_BENCH_SIZE", 8)
	racks := envInt("GANG_BENCH_RACKS", 0)
	groupClaim := os.Getenv("GANG_BENCH_CLAIM") == "group"
	fit := nodes * benchDevicesPerNode / size
	switch {
	case groupClaim:
		fit = nodes * benchDevicesPerNode
	case racks > 0:
		fit = racks * (nodes / racks * benchDevicesPerNode / size)
	}
	if fit > groups {
		fit = groups
	}
	topologyKey, shape := "", "one template claim a pod"
	if racks > 0 {
		topologyKey = "devicelet.dev/rack"
		shape += fmt.Sprintf(", %d racks (topology key %s)", racks, topologyKey)
	}
	if groupClaim {
		shape = strings.Replace(shape, "one template claim a pod", "one PodGroup claim a group", 1)
	}
	only := map[string]bool{"kube": true, "devicelet": true, "ceiling": !groupClaim}
	if v := os.Getenv("GANG_BENCH_ONLY"); v != "" {
		only = map[string]bool{}
		for _, s := range strings.Split(v, ",") {
			only[s] = true
		}
	}
	podGroupRBAC(t)
	c := benchClient(t)
	deciders := []string{"ceiling", "kube", "devicelet"}
	for _, d := range deciders {
		if !only[d] {
			continue
		}
		set := "gang-" + d
		benchNodes(t, c, set, set+".example.com", nodes)
		if racks > 0 {
			err := parallel(nodes, 32, func(i int) error {
				patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"rack-%d"}}}`, topologyKey, i%racks)
				_, err := c.CoreV1().Nodes().Patch(ctx(t), fmt.Sprintf("%s-%d", set, i), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		driverClass(t, set, set+".example.com")
		ns := namespace(t, set)
		createTemplate(t, ns, "gpu", claimSpec(set))
		started := time.Now()
		benchGangPods(t, c, ns, set, set, groups, size, topologyKey, groupClaim)
		t.Logf("%s: %d nodes, %d groups of %d with their claims created in %v", d, nodes, groups, size, time.Since(started))
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n%d nodes × %d devices, %d gangs of %d (%s, members interleaved); %d groups can run:\n",
		nodes, benchDevicesPerNode, groups, size, shape, fit)
	fmt.Fprintf(&table, "%-34s %8s %12s %12s %12s %14s %14s %8s %6s %6s %12s\n", "decider", "pods/s", "start→last", "group p50", "group p99", "decision p50", "decision p99", "whole", "part", "twice", "CPU waiting")
	for _, d := range deciders {
		if !only[d] {
			continue
		}
		ns := "gang-" + d
		want := fit * size
		watch := watchBinds(t, c, ns, want)
		started := time.Now()
		var proc *process
		var text func() string
		name := d
		switch d {
		case "ceiling":
			// A binder that decides nothing: the groups that fit, one after another, each
			// member written as a scheduler writes it (the API server's own ceiling).
			ceilingGangs(t, c, ns, want)
			r := watch.wait(t, "API server ceiling (binder deciding nothing)", started, 900*time.Second)
			fmt.Fprintf(&table, "%-34s %8.1f %12v\n", r.name, r.rate, r.total.Round(time.Millisecond))
			continue
		case "kube":
			url, p := startBenchKubeSchedulerWith(t, ns, "DRADeviceTaintRules=true,GenericWorkload=true,GangScheduling=true,DRAWorkloadResourceClaims=true,TopologyAwareWorkloadScheduling=true")
			proc, name = p, "kube-scheduler v1.36.3"
			text = func() string { return scrapeAsAdmin(t, url) }
		case "devicelet":
			p, addr := startScheduler(t, "--scheduler-name", ns)
			proc, name = p, "devicelet scheduler"
			text = func() string { return scrape(t, addr) }
		}
		r := watch.wait(t, name, started, 1800*time.Second)
		// Per group: its last member's binding, from the start (every member existed before).
		watch.mu.Lock()
		last := map[string]time.Time{}
		for pod, at := range watch.at {
			g := pod[:strings.LastIndexByte(pod, '-')]
			if at.After(last[g]) {
				last[g] = at
			}
		}
		watch.mu.Unlock()
		var groupDone []float64
		for _, at := range last {
			groupDone = append(groupDone, at.Sub(started).Seconds())
		}
		sort.Float64s(groupDone)
		p50, p99 := quantile(groupDone, 0.5), quantile(groupDone, 0.99)
		metrics := text()
		decision, _ := histogramQuantile(metrics, "scheduler_podgroup_scheduling_algorithm_duration_seconds", "", 0.99)
		decision50, _ := histogramQuantile(metrics, "scheduler_podgroup_scheduling_algorithm_duration_seconds", "", 0.5)
		cpu := "-"
		if fit < groups {
			// Groups wait now: the decider's CPU over 10 s with nothing changing.
			time.Sleep(2 * time.Second)
			before := cpuSeconds(t, proc.cmd.Process.Pid)
			time.Sleep(10 * time.Second)
			cpu = fmt.Sprintf("%.3f cores", (cpuSeconds(t, proc.cmd.Process.Pid)-before)/10)
		}
		whole, partial, twice := gangAudit(t, c, ns, size)
		fmt.Fprintf(&table, "%-34s %8.1f %12v %10.2f s %10.2f s %12.2f ms %12.2f ms %8d %6d %6d %12s\n",
			name, r.rate, r.total.Round(time.Millisecond), p50, p99, decision50*1e3, decision*1e3, whole, partial, twice, cpu)
		if partial != 0 || twice != 0 {
			t.Errorf("%s: %d groups partly bound, %d devices allocated twice", name, partial, twice)
		}
		proc.stop()
	}
	t.Log(table.String())
}

// ceilingGangs binds the first `want` pods of ns, group by group (g0's members, then g1's, ...),
// each to the next free device of the node set, as the API server's ceiling for these writes.
func ceilingGangs(t *testing.T, c kubernetes.Interface, ns string, want int) {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		pods = append(pods, &list.Items[i])
	}
	index := func(p *corev1.Pod) (int, int) {
		var g, m int
		fmt.Sscanf(p.Name, "g%d-%d", &g, &m)
		return g, m
	}
	sort.Slice(pods, func(i, j int) bool {
		gi, mi := index(pods[i])
		gj, mj := index(pods[j])
		return gi < gj || (gi == gj && mi < mj)
	})
	ceilingBindOrdered(t, c, ns, ns, ns+".example.com", pods[:want])
}
