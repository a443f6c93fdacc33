package cluster

// NUMA-aware device choice (issue 41, devicelet's own): two devicelet nodes under
// single-numa-node with the static CPU policy, each running the example DRA driver with
// `--numa-nodes 2 --kubeconfig` (its devices publish resource.kubernetes.io/numaNode to the API
// server). The nodes publish each NUMA node's free exclusive CPUs on their Node; devicelet's
// scheduler then puts a Guaranteed GPU pod's device on a NUMA node that still has its CPUs.
// The same pod under a profile without it (numaAlignment: false), spreading by device count,
// goes to the node with more free GPUs and is refused there with TopologyAffinityError.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const numaDriver = "numa-gpu.example.com"

// numaReport is the devicelet.dev/numa-resources annotation (devicelet_kube::numa_resources).
type numaReport struct {
	TopologyManagerPolicy string `json:"topologyManagerPolicy"`
	NumaNodes             []struct {
		ID   int    `json:"id"`
		CPUs *int64 `json:"cpus"`
	} `json:"numaNodes"`
	Pods []string `json:"pods"`
}

// freeCPUsPerNUMA reads node `name`'s report: free exclusive CPUs per NUMA node, or "" when
// there is none yet.
func freeCPUsPerNUMA(t *testing.T, name string) string {
	t.Helper()
	n, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	raw, ok := n.Annotations["devicelet.dev/numa-resources"]
	if !ok {
		return ""
	}
	var r numaReport
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatalf("node %s: bad numa-resources annotation %q: %v", name, raw, err)
	}
	var parts []string
	for _, n := range r.NumaNodes {
		c := "-"
		if n.CPUs != nil {
			c = fmt.Sprint(*n.CPUs)
		}
		parts = append(parts, c)
	}
	return r.TopologyManagerPolicy + " " + strings.Join(parts, ",")
}

// startNUMANode runs a devicelet node with a described 2-NUMA machine of 6 CPUs per NUMA node
// (CPU 0 reserved) under single-numa-node and the static CPU policy, and the example DRA
// driver with `gpus` devices split over the two NUMA nodes, publishing to the API server.
func startNUMANode(t *testing.T, name string, gpus int) *node {
	t.Helper()
	config := filepath.Join(shortTempDir(t), "kubelet.yaml")
	writeFile(t, config, `topologyManagerPolicy: single-numa-node
cpuManagerPolicy: static
reservedSystemCPUs: "0"
devicelet:
  machine:
    nodes: 2
    cpusPerNode: 6
`)
	n := startNode(t, name, "--config", config, "--capacity", "cpu=12,memory=64Gi,pods=110")
	startProcess(t, "example-driver "+name, "example-driver", "--root-dir", n.root,
		"--name", numaDriver, "--devices", fmt.Sprint(gpus), "--numa-nodes", "2",
		"--kubeconfig", n.kubeconfig, "--node-name", name)
	waitFor(t, 60*time.Second, name+"'s ResourceSlice", func() (bool, string) {
		list, err := controlPlane.admin.ResourceV1().ResourceSlices().List(ctx(t), metav1.ListOptions{
			FieldSelector: "spec.nodeName=" + name + ",spec.driver=" + numaDriver,
		})
		if err != nil {
			return false, err.Error()
		}
		count := 0
		for _, s := range list.Items {
			count += len(s.Spec.Devices)
		}
		return count == gpus, fmt.Sprintf("%d devices", count)
	})
	return n
}

// guaranteedSpec is a Guaranteed one-container pod with `cpus` CPUs and 1Gi.
func guaranteedSpec(cpus int64) corev1.PodSpec {
	amounts := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(cpus, resource.DecimalSI),
		corev1.ResourceMemory: resource.MustParse("1Gi"),
	}
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		Containers: []corev1.Container{{
			Name:      "main",
			Image:     "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Limits: amounts, Requests: amounts},
		}},
	}
}

// admittedPod is a pod as `devicelet get pods -o json` prints it (the fields read here).
type admittedPod struct {
	Pod struct {
		Name string `json:"name"`
	} `json:"pod"`
	Containers []struct {
		Cpus         string `json:"cpus"`
		NumaAffinity []int  `json:"numaAffinity"`
	} `json:"containers"`
}

func TestSchedulerPutsDRADevicesWhereTheirNUMANodeHasTheCPUs(t *testing.T) {
	ns := namespace(t, "sched-numa")
	// A: 2 GPUs (gpu-0 on NUMA 0, gpu-1 on NUMA 1). B: 8 GPUs, 4 per NUMA node.
	a := startNUMANode(t, "numa-a", 2)
	b := startNUMANode(t, "numa-b", 8)
	// Fillers with exclusive CPUs, bound directly: A's NUMA 0 full (5 of its 5, the lowest
	// NUMA node that fits); B's two 4-CPU pods leave 1 and 2 CPUs, so no NUMA node of B has the
	// 3 the GPU pod needs, though B has 4 of 12 free as a whole.
	for _, f := range []struct {
		node *node
		name string
		cpus int64
	}{{a, "fill-a", 5}, {b, "fill-b0", 4}, {b, "fill-b1", 4}} {
		spec := guaranteedSpec(f.cpus)
		spec.NodeName = f.node.name
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: f.name, Namespace: ns}, Spec: spec}
		if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForPodRunning(t, ns, f.name)
	}
	for node, want := range map[string]string{a.name: "single-numa-node 0,6", b.name: "single-numa-node 1,2"} {
		waitFor(t, 30*time.Second, node+"'s free CPUs per NUMA node", func() (bool, string) {
			got := freeCPUsPerNUMA(t, node)
			return got == want, got
		})
	}

	for _, n := range []*node{a, b} {
		got, _ := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), n.name, metav1.GetOptions{})
		t.Logf("%s publishes %s", n.name, got.Annotations["devicelet.dev/numa-resources"])
	}
	driverClass(t, "numa-gpu", numaDriver)
	createTemplate(t, ns, "numa-gpu", claimSpec("numa-gpu"))
	config := filepath.Join(t.TempDir(), "scheduler.yaml")
	spread := `  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: LeastAllocated
        resources: [{name: deviceclass.resource.kubernetes.io/numa-gpu, weight: 1}]
`
	text := `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
profiles:
- schedulerName: numa-aligned
` + spread + `- schedulerName: device-spreader
` + spread + `  - name: DynamicResources
    args: {numaAlignment: false}
`
	if err := os.WriteFile(config, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	startScheduler(t, "--config", config)

	gpuPod := func(name, scheduler string) {
		spec := guaranteedSpec(3)
		spec.SchedulerName = scheduler
		usePodClaim(&spec, "numa-gpu", "")
		spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{a.name, b.name},
				}}}},
			},
		}}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
		if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Spreading by device count alone: B (8 free GPUs) beats A (2), and B refuses the pod.
	gpuPod("spread", "device-spreader")
	var refused *corev1.Pod
	waitFor(t, 60*time.Second, "pod spread Failed", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "spread", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		refused = p
		return p.Status.Phase == corev1.PodFailed, fmt.Sprintf("%s on %q", p.Status.Phase, p.Spec.NodeName)
	})
	if refused.Spec.NodeName != b.name || refused.Status.Reason != "TopologyAffinityError" {
		t.Fatalf("the spreading profile's pod: node %q, reason %q, message %q; want %s, TopologyAffinityError",
			refused.Spec.NodeName, refused.Status.Reason, refused.Status.Message, b.name)
	}
	t.Logf("spreading by device count: %s on %s, %s: %s", refused.Name, refused.Spec.NodeName, refused.Status.Reason, refused.Status.Message)
	deletePodAndWait(t, ns, "spread")

	// With the nodes' NUMA reports: A, its GPU on NUMA 1, CPUs from NUMA 1.
	gpuPod("aligned", "numa-aligned")
	running := waitForPodRunning(t, ns, "aligned")
	if running.Spec.NodeName != a.name {
		t.Fatalf("pod aligned on %q, want %s", running.Spec.NodeName, a.name)
	}
	claim, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), podClaimName(running), metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil {
		t.Fatalf("the pod's claim: %v %+v", err, claim)
	}
	devices := deviceList(claim.Status.Allocation.Devices.Results)
	if devices != "gpu="+numaDriver+"/numa-a/gpu-1" {
		t.Fatalf("pod aligned got %s, want gpu-1 (NUMA 1)", devices)
	}
	var list struct {
		Pods []admittedPod `json:"pods"`
	}
	if err := json.Unmarshal([]byte(a.cli(t, "get", "pods", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range list.Pods {
		if p.Pod.Name != "aligned" {
			continue
		}
		found = true
		c := p.Containers[0]
		if fmt.Sprint(c.NumaAffinity) != "[1]" || c.Cpus == "" {
			t.Fatalf("pod aligned on %s: cpus %q, NUMA affinity %v; want CPUs of NUMA 1", a.name, c.Cpus, c.NumaAffinity)
		}
		t.Logf("aligned on %s: %s, CPUs %s, NUMA affinity %v", a.name, devices, c.Cpus, c.NumaAffinity)
	}
	if !found {
		t.Fatalf("pod aligned is not admitted on %s", a.name)
	}
	// A's report now counts it: NUMA 1 has 3 CPUs left.
	waitFor(t, 30*time.Second, a.name+"'s report after the pod", func() (bool, string) {
		got := freeCPUsPerNUMA(t, a.name)
		return got == "single-numa-node 0,3", got
	})
}
