package cluster

// scheduler_perf's PreemptionBasic and TopologySpreading (spec workloads.md W137, W140), for
// kube-scheduler v1.36.3 and `devicelet scheduler` in the same run, each on its own API-object
// nodes (a label, pods select it by nodeSelector) with scheduler_perf's node shape (4 cpu, 32Gi,
// 110 pods):
//
//   - PreemptionBasic: every node full with 4 low-priority init pods of 900m (grace period 0),
//     then measured pods of priority 10 asking 3000m: each preempts three init pods.
//   - TopologySpreading: nodes in zones moon-1..3, pods of 100m/500Mi (`pod-default`) with a
//     DoNotSchedule constraint of maxSkew 5 over the zone.
//
// Pods exist before the decider starts (init pods are scheduled by the decider itself first, not
// timed); the rate is taken over the second half of the measured pods, as the throughput test
// does. CI runs the integration size (5 nodes, 20 init pods, 5 preemptors; 15 nodes, 60 pods)
// and checks the outcome: every preemptor bound, only init pods evicted, the zones within the
// skew. With SCHEDULER_BENCH=1 it runs the performance size and prints the figures:
//
//	SCHEDULER_PERF_PREEMPTION_NODES  nodes for PreemptionBasic (bench default 500; scheduler_perf's 1000Nodes)
//	SCHEDULER_PERF_SPREAD_NODES      nodes for TopologySpreading (bench default 1000)
//	SCHEDULER_PERF_SPREAD_PODS       pods for TopologySpreading (bench default = nodes)
//	SCHEDULER_BENCH_ONLY             comma-separated subset of kube,devicelet

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// perfNodes creates n API-object nodes SET-0.. with scheduler_perf's shape, in zones moon-1..3
// when zones is set.
func perfNodes(t *testing.T, c kubernetes.Interface, set string, n int, zones bool) {
	t.Helper()
	res := corev1.ResourceList{"cpu": resource.MustParse("4"), "memory": resource.MustParse("32Gi"), "pods": resource.MustParse("110")}
	err := parallel(n, 32, func(i int) error {
		name := fmt.Sprintf("%s-%d", set, i)
		labels := map[string]string{
			"kubernetes.io/hostname": name, "devicelet.dev/api-only": "true", "devicelet.dev/bench": set,
		}
		if zones {
			labels["topology.kubernetes.io/zone"] = fmt.Sprintf("moon-%d", i%3+1)
		}
		created, err := c.CoreV1().Nodes().Create(ctx(t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		// kube-controller-manager writes new nodes too: retry on a conflict.
		for attempt := 0; ; attempt++ {
			created.Status.Capacity, created.Status.Allocatable = res, res
			if _, err = c.CoreV1().Nodes().UpdateStatus(ctx(t), created, metav1.UpdateOptions{}); err == nil || !apierrors.IsConflict(err) || attempt == 10 {
				return err
			}
			if created, err = c.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
	})
	if err != nil {
		t.Fatalf("perf nodes %s: %v", set, err)
	}
	t.Cleanup(func() {
		_ = parallel(n, 32, func(i int) error {
			return c.CoreV1().Nodes().Delete(ctx(t), fmt.Sprintf("%s-%d", set, i), metav1.DeleteOptions{})
		})
	})
}

// perfPods creates n pods PREFIX0.. in ns for `scheduler` on node set `set`, asking cpu and
// memory, changed by mutate.
func perfPods(t *testing.T, c kubernetes.Interface, ns, prefix, set, scheduler string, n int, cpu, memory string, mutate func(*corev1.PodSpec)) {
	t.Helper()
	err := parallel(n, 32, func(i int) error {
		spec := corev1.PodSpec{
			SchedulerName: scheduler,
			NodeSelector:  map[string]string{"devicelet.dev/bench": set},
			// Nodes without an agent are tainted unreachable after a grace period.
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					"cpu": resource.MustParse(cpu), "memory": resource.MustParse(memory),
				}},
			}},
		}
		if mutate != nil {
			mutate(&spec)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", prefix, i), Namespace: ns, Labels: map[string]string{"app": prefix}}, Spec: spec}
		_, err := c.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("create pods in %s: %v", ns, err)
	}
}

// startDecider starts kube-scheduler or devicelet scheduler for profile `name`; returns a
// function that scrapes its metrics.
func startDecider(t *testing.T, decider, name string) func() string {
	t.Helper()
	if decider == "kube" {
		url := startBenchKubeScheduler(t, name)
		return func() string { return scrapeAsAdmin(t, url) }
	}
	_, addr := startScheduler(t, "--scheduler-name", name)
	return func() string { return scrape(t, addr) }
}

func TestSchedulerPerfPreemptionAndTopologySpreading(t *testing.T) {
	bench := os.Getenv("SCHEDULER_BENCH") != ""
	// The performance size with SCHEDULER_BENCH=1, else the integration size.
	size := func(perf, integration int) int {
		if bench {
			return perf
		}
		return integration
	}
	preemptNodes := envInt("SCHEDULER_PERF_PREEMPTION_NODES", size(500, 5))
	spreadNodes := envInt("SCHEDULER_PERF_SPREAD_NODES", size(1000, 15))
	spreadPods := envInt("SCHEDULER_PERF_SPREAD_PODS", size(spreadNodes, 60))
	only := map[string]bool{"kube": true, "devicelet": true}
	if v := os.Getenv("SCHEDULER_BENCH_ONLY"); v != "" {
		only = map[string]bool{}
		for _, s := range strings.Split(v, ",") {
			only[s] = true
		}
	}
	c := benchClient(t)
	priorityClass(t, "perf-preemptor", 10, nil)
	var table strings.Builder
	fmt.Fprintf(&table, "\nPreemptionBasic: %d nodes, %d init pods of 900m, %d preemptors of 3000m at priority 10; "+
		"TopologySpreading: %d nodes in 3 zones, %d pods (maxSkew 5, DoNotSchedule):\n", preemptNodes, 4*preemptNodes, preemptNodes, spreadNodes, spreadPods)
	fmt.Fprintf(&table, "%-12s %-18s %10s %12s %14s %14s\n", "decider", "workload", "pods/s", "start→last", "attempt p50", "attempt p99")
	for _, d := range []string{"kube", "devicelet"} {
		if !only[d] {
			continue
		}
		// PreemptionBasic.
		set := "perf-pre-" + d
		perfNodes(t, c, set, preemptNodes, false)
		initNS := namespace(t, set+"-init")
		ns := namespace(t, set)
		perfPods(t, c, initNS, "init", set, set, 4*preemptNodes, "900m", "500Mi", nil)
		initWatch := watchBinds(t, c, initNS, 4*preemptNodes)
		scrapeMetrics := startDecider(t, d, set)
		initWatch.wait(t, d+" init pods", time.Now(), 900*time.Second)
		watch := watchBinds(t, c, ns, preemptNodes)
		started := time.Now()
		perfPods(t, c, ns, "preemptor", set, set, preemptNodes, "3000m", "500Mi", func(s *corev1.PodSpec) {
			s.PriorityClassName = "perf-preemptor"
		})
		r := watch.wait(t, d+" PreemptionBasic", started, 1800*time.Second)
		r.fromMetrics(scrapeMetrics(), set)
		checkPreemptionOutcome(t, c, initNS, ns, preemptNodes)
		fmt.Fprintf(&table, "%-12s %-18s %10.1f %12v %11.1f ms %11.1f ms\n", d, "PreemptionBasic", r.rate, r.total.Round(time.Millisecond), r.p50*1e3, r.p99*1e3)

		// TopologySpreading.
		set = "perf-spread-" + d
		perfNodes(t, c, set, spreadNodes, true)
		ns = namespace(t, set)
		perfPods(t, c, ns, "spread", set, set, spreadPods, "100m", "500Mi", func(s *corev1.PodSpec) {
			s.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
				MaxSkew: 5, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.DoNotSchedule,
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "spread"}},
			}}
		})
		watch = watchBinds(t, c, ns, spreadPods)
		started = time.Now()
		scrapeMetrics = startDecider(t, d, set)
		r = watch.wait(t, d+" TopologySpreading", started, 1800*time.Second)
		r.fromMetrics(scrapeMetrics(), set)
		checkZoneSkew(t, c, ns, spreadPods, 5)
		fmt.Fprintf(&table, "%-12s %-18s %10.1f %12v %11.1f ms %11.1f ms\n", d, "TopologySpreading", r.rate, r.total.Round(time.Millisecond), r.p50*1e3, r.p99*1e3)
		if os.Getenv("SCHEDULER_PERF_DUMP") != "" {
			t.Log(scrapeMetrics())
		}
	}
	t.Log(table.String())
}

// checkPreemptionOutcome: every preemptor bound, and what was evicted were init pods, three per
// preemptor at least (4 × 900m leave 400m; 3000m needs three of them gone).
func checkPreemptionOutcome(t *testing.T, c kubernetes.Interface, initNS, ns string, preemptors int) {
	t.Helper()
	pods, err := c.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			t.Errorf("preemptor %s not bound", p.Name)
		}
		perNode[p.Spec.NodeName]++
	}
	for node, n := range perNode {
		if n > 1 {
			t.Errorf("%d preemptors of 3000m on node %s of 4 cpu", n, node)
		}
	}
	left, err := c.CoreV1().Pods(initNS).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if evicted := 4*preemptors - len(left.Items); evicted < 3*preemptors {
		t.Errorf("%d init pods evicted for %d preemptors, want at least %d", evicted, preemptors, 3*preemptors)
	}
}

// checkZoneSkew: every pod of ns bound, and the pods per zone within maxSkew of each other.
func checkZoneSkew(t *testing.T, c kubernetes.Interface, ns string, want, maxSkew int) {
	t.Helper()
	pods, err := c.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	zones := map[string]int{"moon-1": 0, "moon-2": 0, "moon-3": 0}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			t.Errorf("pod %s not bound", p.Name)
			continue
		}
		var i int
		if _, err := fmt.Sscanf(p.Spec.NodeName[strings.LastIndex(p.Spec.NodeName, "-")+1:], "%d", &i); err != nil {
			t.Fatalf("node name %s", p.Spec.NodeName)
		}
		zones[fmt.Sprintf("moon-%d", i%3+1)]++
	}
	lo, hi := want, 0
	for _, n := range zones {
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi-lo > maxSkew {
		t.Errorf("pods per zone %v: skew %d above %d", zones, hi-lo, maxSkew)
	}
}
