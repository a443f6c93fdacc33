package cluster

// Throughput of devicelet's scheduler beside the control plane's kube-scheduler on the same
// workload, in the same run (issue 25's benchmark, scaled to this machine): nodes as API
// objects with one ResourceSlice of 10 devices each, pods with one template claim each. Run with
// SCHEDULER_BENCH=1 (not part of CI): SCHEDULER_BENCH_NODES (default 100) and
// SCHEDULER_BENCH_PODS (default 500) per scheduler.
//
// The rate is from the first pod created to the last one bound, so it includes
// kube-controller-manager creating the claims; kube-scheduler runs with client QPS 100 (up.sh),
// devicelet's scheduler without a client-side rate limit.

import (
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func benchScheduler(t *testing.T, scheduler, driver string, pods int) float64 {
	ns := namespace(t, "bench-"+driver)
	driverClass(t, "bench-"+driver, driver+".example.com")
	createTemplate(t, ns, "gpu", claimSpec("bench-"+driver))
	start := time.Now()
	for i := 0; i < pods; i++ {
		schedPodFor(t, ns, fmt.Sprintf("b%d", i), scheduler)
	}
	waitForEvery(t, 600*time.Second, 500*time.Millisecond, scheduler+": every pod bound", func() (bool, string) {
		bound, _, err := placement(t, ns, "b")
		if err != nil {
			return false, err.Error()
		}
		return bound == pods, fmt.Sprintf("%d of %d bound", bound, pods)
	})
	elapsed := time.Since(start)
	rate := float64(pods) / elapsed.Seconds()
	t.Logf("%s: %d pods with template claims bound in %v: %.1f pods/s", scheduler, pods, elapsed, rate)
	checkAgainstGoAllocator(t, ns)
	return rate
}

func schedPodFor(t *testing.T, ns, name, scheduler string) {
	t.Helper()
	schedPod(t, ns, name, "gpu", "", func(s *corev1.PodSpec) { s.SchedulerName = scheduler })
}

func TestSchedulerThroughputBesideKubeScheduler(t *testing.T) {
	if os.Getenv("SCHEDULER_BENCH") == "" {
		t.Skip("set SCHEDULER_BENCH=1 to run the throughput comparison")
	}
	nodes := envInt("SCHEDULER_BENCH_NODES", 100)
	pods := envInt("SCHEDULER_BENCH_PODS", 500)
	for i := 0; i < nodes; i++ {
		apiNodeFor(t, fmt.Sprintf("bk-%d", i), 10, "kube.example.com")
		apiNodeFor(t, fmt.Sprintf("bd-%d", i), 10, "dl.example.com")
	}
	startScheduler(t)
	kube := benchScheduler(t, "default-scheduler", "kube", pods)
	ours := benchScheduler(t, schedulerName, "dl", pods)
	t.Logf("%d+%d nodes, %d pods each: kube-scheduler %.1f pods/s, devicelet-scheduler %.1f pods/s (%.1fx)", nodes, nodes, pods, kube, ours, ours/kube)
}
