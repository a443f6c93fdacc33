package cluster

// InterPodAffinity and PodTopologySpread in `devicelet scheduler`, beside kube-scheduler
// v1.36.3 on the same objects: Deployments whose replicas keep apart (required pod
// anti-affinity per host), spread over zones (topologySpreadConstraints, DoNotSchedule) and
// follow another Deployment's zone (required pod affinity).

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// interPodOutcome is what one scheduler made of the Deployments.
type interPodOutcome struct {
	// Bound replicas of "anti" per node, sorted, and the pending one's condition message.
	antiPerNode []int
	antiPending string
	// Bound replicas of "spread" per zone, sorted.
	spreadPerZone []int
	// Zones of "follow" replicas and of the "lead" replica they follow.
	followZones map[string]int
	leadZone    string
}

func TestSchedulerInterPodPlacementsLikeKubeScheduler(t *testing.T) {
	results := map[string]interPodOutcome{}
	for _, d := range []string{"kube", "devicelet"} {
		ns := namespace(t, "interpod-"+d)
		// 3 zones of 2 nodes for this scheduler's pods.
		for z := 0; z < 3; z++ {
			for n := 0; n < 2; n++ {
				name := fmt.Sprintf("ip-%s-z%d-n%d", d, z, n)
				apiNodeFor(t, name, 1, "ip-"+d+".example.com")
				patch := fmt.Sprintf(`{"metadata":{"labels":{"topology.kubernetes.io/zone":"z%d","devicelet.dev/interpod":%q}}}`, z, d)
				if _, err := controlPlane.admin.CoreV1().Nodes().Patch(ctx(t), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		switch d {
		case "kube":
			startBenchKubeSchedulerWith(t, ns, "DRADeviceTaintRules=true")
		case "devicelet":
			startScheduler(t, "--scheduler-name", ns)
		}
		interPodDeployment(t, ns, d, "lead", 1, nil)
		waitFor(t, 60*time.Second, d+": lead bound", func() (bool, string) {
			z := zonesOf(t, ns, "lead")
			return len(z) == 1, fmt.Sprint(z)
		})
		interPodDeployment(t, ns, d, "anti", 7, &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				TopologyKey:   "kubernetes.io/hostname",
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "anti"}},
			}},
		}})
		interPodDeployment(t, ns, d, "spread", 9, nil)
		interPodDeployment(t, ns, d, "follow", 4, &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				TopologyKey:   "topology.kubernetes.io/zone",
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "lead"}},
			}},
		}})
		var out interPodOutcome
		waitForEvery(t, 120*time.Second, time.Second, d+": every replica placed or refused", func() (bool, string) {
			pods, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			nodeZone := map[string]string{}
			nodes, err := controlPlane.admin.CoreV1().Nodes().List(ctx(t), metav1.ListOptions{LabelSelector: "devicelet.dev/interpod=" + d})
			if err != nil {
				return false, err.Error()
			}
			for _, n := range nodes.Items {
				nodeZone[n.Name] = n.Labels["topology.kubernetes.io/zone"]
			}
			perNode, perZone := map[string]int{}, map[string]int{}
			out = interPodOutcome{followZones: map[string]int{}}
			bound := 0
			for _, p := range pods.Items {
				app := p.Labels["app"]
				if p.Spec.NodeName == "" {
					if c := podScheduledCondition(&p); app == "anti" && c != nil && c.Reason == "Unschedulable" {
						out.antiPending = c.Message
					}
					continue
				}
				bound++
				zone := nodeZone[p.Spec.NodeName]
				switch app {
				case "anti":
					perNode[p.Spec.NodeName]++
				case "spread":
					perZone[zone]++
				case "follow":
					out.followZones[zone]++
				case "lead":
					out.leadZone = zone
				}
			}
			for _, n := range perNode {
				out.antiPerNode = append(out.antiPerNode, n)
			}
			for _, n := range perZone {
				out.spreadPerZone = append(out.spreadPerZone, n)
			}
			sort.Ints(out.antiPerNode)
			sort.Ints(out.spreadPerZone)
			return bound == 1+6+9+4 && out.antiPending != "", fmt.Sprintf("%d bound: %+v", bound, out)
		})
		t.Logf("%s: anti per node %v, pending: %s; spread per zone %v; follow %v beside lead in %s",
			d, out.antiPerNode, out.antiPending, out.spreadPerZone, out.followZones, out.leadZone)
		results[d] = out
	}
	for _, d := range []string{"kube", "devicelet"} {
		r := results[d]
		if fmt.Sprint(r.antiPerNode) != "[1 1 1 1 1 1]" {
			t.Errorf("%s: anti replicas per node %v, want one on each of the 6 nodes", d, r.antiPerNode)
		}
		if !strings.Contains(r.antiPending, "didn't match pod anti-affinity rules") {
			t.Errorf("%s: the 7th anti replica's condition: %q", d, r.antiPending)
		}
		if fmt.Sprint(r.spreadPerZone) != "[3 3 3]" {
			t.Errorf("%s: spread replicas per zone %v, want 3 in each", d, r.spreadPerZone)
		}
		if len(r.followZones) != 1 || r.followZones[r.leadZone] != 4 {
			t.Errorf("%s: follow replicas by zone %v, want all 4 in the lead's zone %s", d, r.followZones, r.leadZone)
		}
	}
}

// interPodDeployment creates Deployment `name` in ns for scheduler ns on the nodes of set `d`.
func interPodDeployment(t *testing.T, ns, d, name string, replicas int32, affinity *corev1.Affinity) {
	t.Helper()
	labels := map[string]string{"app": name}
	spec := podSpec("", 0)
	spec.SchedulerName = ns
	spec.NodeSelector = map[string]string{"devicelet.dev/interpod": d}
	// Nodes without an agent are tainted unreachable after a grace period.
	spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	spec.Affinity = affinity
	if name == "spread" {
		spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
		}}
	}
	createDeploymentWith(t, ns, name, replicas, spec)
}

// zonesOf counts the bound pods of app `app` in ns per zone of their node.
func zonesOf(t *testing.T, ns, app string) map[string]int {
	t.Helper()
	pods, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" {
			continue
		}
		n, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out[n.Labels["topology.kubernetes.io/zone"]]++
	}
	return out
}
