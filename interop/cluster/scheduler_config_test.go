package cluster

// `devicelet scheduler --config`: a KubeSchedulerConfiguration with a MostAllocated profile packs
// one-GPU pods onto one node, where the default profile (LeastAllocated) spreads them; a bad
// configuration stops the start with the field named.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// packNodes makes 4 API nodes × 8 devices of `driver`, labelled devicelet.dev/pack=set.
func packNodes(t *testing.T, set, driver string) {
	t.Helper()
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("%s-%d", set, i)
		apiNodeFor(t, name, 8, driver)
		patch := fmt.Sprintf(`{"metadata":{"labels":{"devicelet.dev/pack":%q}}}`, set)
		if _, err := controlPlane.admin.CoreV1().Nodes().Patch(ctx(t), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// nodesUsed waits until the n pods named PREFIX* in ns are bound and returns how many nodes they
// are on.
func nodesUsed(t *testing.T, ns, prefix string, n int) map[string]int {
	t.Helper()
	var used map[string]int
	waitFor(t, 60*time.Second, fmt.Sprintf("%d %s pods bound", n, prefix), func() (bool, string) {
		list, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		used = map[string]int{}
		bound := 0
		for _, p := range list.Items {
			if strings.HasPrefix(p.Name, prefix) && p.Spec.NodeName != "" {
				used[p.Spec.NodeName]++
				bound++
			}
		}
		return bound == n, fmt.Sprint(used)
	})
	return used
}

func TestSchedulerConfigMostAllocatedPacksGPUs(t *testing.T) {
	ns := namespace(t, "sched-config")
	packNodes(t, "packed", "packed.example.com")
	packNodes(t, "spread", "spread.example.com")
	driverClass(t, "packed-gpu", "packed.example.com")
	driverClass(t, "spread-gpu", "spread.example.com")
	createTemplate(t, ns, "packed", claimSpec("packed-gpu"))
	createTemplate(t, ns, "spread", claimSpec("spread-gpu"))
	config := filepath.Join(t.TempDir(), "scheduler.yaml")
	text := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: gpu-packer
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources: [{name: cpu, weight: 1}, {name: memory, weight: 1}]
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	startScheduler(t, "--config", config)
	startScheduler(t, "--scheduler-name", "gpu-spreader")
	pods := func(prefix, scheduler, template string) {
		for i := 0; i < 8; i++ {
			spec := podSpec("", 0)
			spec.SchedulerName = scheduler
			usePodClaim(&spec, template, "")
			spec.NodeSelector = map[string]string{"devicelet.dev/pack": template}
			// Requests that move the scores (a pod asking nothing counts 100m of 32 CPUs:
			// 0 in both strategies' integer scores, upstream as here).
			spec.Containers[0].Resources.Requests = corev1.ResourceList{"cpu": resource.MustParse("4"), "memory": resource.MustParse("8Gi")}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", prefix, i), Namespace: ns}, Spec: spec}
			if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// One at a time: each decision sees the previous pod's usage.
			nodesUsed(t, ns, prefix, i+1)
		}
	}
	pods("most-", "gpu-packer", "packed")
	pods("least-", "gpu-spreader", "spread")
	packed, spread := nodesUsed(t, ns, "most-", 8), nodesUsed(t, ns, "least-", 8)
	t.Logf("MostAllocated profile: %v; default profile: %v", packed, spread)
	if len(packed) != 1 {
		t.Fatalf("MostAllocated spread 8 one-GPU pods over %d nodes: %v", len(packed), packed)
	}
	if len(spread) != 4 {
		t.Fatalf("the default profile put 8 pods on %d of 4 nodes: %v", len(spread), spread)
	}
}

func TestSchedulerConfigRefusedWithTheFieldNamed(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"profiles:\n- pluginConfig:\n  - name: NodeResourcesFit\n    args: {scoringStrategy: {type: MostAllocated, resources: [{name: cpu, weight: 101}]}}\n": "profiles[0].pluginConfig[0].args.scoringStrategy.resources[0].weight: resource weight of 101 not in valid range (0, 100]",
		"profiles:\n- plugins:\n    score:\n      enabled: [{name: NoSuchPlugin}]\n":                                                                          `profiles[0].plugins.score.enabled[0]: unknown plugin "NoSuchPlugin"`,
		"percentageOfNodesToScroe: 50\n": "percentageOfNodesToScroe",
	} {
		file := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(file, []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"+body), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Getenv("DEVICELET_BIN"), "scheduler", "--config", file, "--kubeconfig", adminKubeconfig())
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("a bad config was accepted:\n%s", body)
		}
		if !strings.Contains(string(out), want) {
			t.Fatalf("config %q: error does not name the field (%q):\n%s", body, want, out)
		}
	}
}

// Two profiles in one --config, one process: pods of both are placed from one cache, so no
// device is given twice, and each profile scores as configured and is named in the metrics.
func TestSchedulerConfigTwoProfilesOneProcess(t *testing.T) {
	ns := namespace(t, "sched-profiles")
	packNodes(t, "both", "both.example.com")
	driverClass(t, "both-gpu", "both.example.com")
	createTemplate(t, ns, "both", claimSpec("both-gpu"))
	config := filepath.Join(t.TempDir(), "scheduler.yaml")
	text := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: gpu-packer
  pluginConfig:
  - name: NodeResourcesFit
    args: {scoringStrategy: {type: MostAllocated}}
- schedulerName: gpu-spreader
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	_, metricsAddr := startScheduler(t, "--config", config)
	// Interleaved, all at once: 8 for each profile, 2 CPUs each (16 × 2 = the 4 nodes' 128
	// CPUs / 4), 16 of the 32 devices.
	err := parallel(16, 8, func(i int) error {
		scheduler, prefix := "gpu-packer", "most-"
		if i%2 == 1 {
			scheduler, prefix = "gpu-spreader", "least-"
		}
		spec := podSpec("", 0)
		spec.SchedulerName = scheduler
		usePodClaim(&spec, "both", "")
		spec.NodeSelector = map[string]string{"devicelet.dev/pack": "both"}
		spec.Containers[0].Resources.Requests = corev1.ResourceList{"cpu": resource.MustParse("2"), "memory": resource.MustParse("4Gi")}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", prefix, i/2), Namespace: ns}, Spec: spec}
		_, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	packed, spread := nodesUsed(t, ns, "most-", 8), nodesUsed(t, ns, "least-", 8)
	t.Logf("one process, two profiles: gpu-packer %v, gpu-spreader %v", packed, spread)
	if len(packed) >= len(spread) {
		t.Fatalf("the MostAllocated profile used %d nodes, the default one %d", len(packed), len(spread))
	}
	claims, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			k := r.Pool + "/" + r.Device
			if other, ok := seen[k]; ok {
				t.Fatalf("device %s given to %s and %s", k, other, c.Name)
			}
			seen[k] = c.Name
		}
	}
	if len(seen) != 16 {
		t.Fatalf("%d devices allocated, want 16", len(seen))
	}
	metrics := scrape(t, metricsAddr)
	for _, profile := range []string{"gpu-packer", "gpu-spreader"} {
		if n := metricSum(metrics, "scheduler_schedule_attempts_total", `profile="`+profile+`"`); n < 8 {
			t.Fatalf("scheduler_schedule_attempts_total for %s: %v, want at least 8", profile, n)
		}
	}
}

// Device bin-packing (spec W117 and devicelet's extension): a MostAllocated profile scoring the
// implicit extended resource of a DeviceClass packs pods that get their GPU through a claim
// and request no cpu or memory, one at a time, onto one node; the same pods under the default
// profile spread. kube-scheduler 1.36.3 scores a DRA-backed resource only for pods that request
// it as an extended resource (W116), so claims are never packed there.
func TestSchedulerConfigPacksGPUClaimsByDeviceClass(t *testing.T) {
	ns := namespace(t, "sched-devpack")
	packNodes(t, "devpack", "devpack.example.com")
	driverClass(t, "devpack-gpu", "devpack.example.com")
	createTemplate(t, ns, "devpack", claimSpec("devpack-gpu"))
	config := filepath.Join(t.TempDir(), "scheduler.yaml")
	text := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: device-packer
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
        resources: [{name: deviceclass.resource.kubernetes.io/devpack-gpu, weight: 1}]
- schedulerName: device-spreader
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: LeastAllocated
        resources: [{name: deviceclass.resource.kubernetes.io/devpack-gpu, weight: 1}]
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	startScheduler(t, "--config", config)
	pods := func(prefix, scheduler string) map[string]int {
		for i := 0; i < 8; i++ {
			spec := podSpec("", 0)
			spec.SchedulerName = scheduler
			usePodClaim(&spec, "devpack", "")
			spec.NodeSelector = map[string]string{"devicelet.dev/pack": "devpack"}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s%d", prefix, i), Namespace: ns}, Spec: spec}
			if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			nodesUsed(t, ns, prefix, i+1)
		}
		return nodesUsed(t, ns, prefix, 8)
	}
	packed := pods("pack-", "device-packer")
	// The packer's 8 GPUs are in use now; delete its pods so both profiles start from the same
	// empty nodes.
	for i := 0; i < 8; i++ {
		if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), fmt.Sprintf("pack-%d", i), metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 60*time.Second, "the packer's claims deallocated", func() (bool, string) {
		claims, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		left := 0
		for _, c := range claims.Items {
			if c.Status.Allocation != nil {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d claims still allocated", left)
	})
	spread := pods("spread-", "device-spreader")
	t.Logf("one GPU claim per pod, no cpu or memory requests: MostAllocated over the class %v, LeastAllocated %v", packed, spread)
	if len(packed) != 1 {
		t.Fatalf("MostAllocated over the device class spread 8 GPU claims over %d nodes: %v", len(packed), packed)
	}
	if len(spread) != 4 {
		t.Fatalf("LeastAllocated over the device class put 8 GPU claims on %d of 4 nodes: %v", len(spread), spread)
	}
}
