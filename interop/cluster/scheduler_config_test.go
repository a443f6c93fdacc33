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
