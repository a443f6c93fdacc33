package scheduler

// Random cases: a cluster snapshot (nodes, bound pods, namespaces, PDBs, spreading owners), a
// pod to schedule and, for about half of them, a KubeSchedulerConfiguration. Everything comes
// from one seed, so a case is reproduced by its seed alone.
//
// The objects look like what the API server stores: every pod has a UID, bound pods have
// spec.nodeName and status.startTime, and matchLabelKeys / mismatchLabelKeys of pod
// (anti-)affinity terms are already merged into their label selectors (the API server does that
// on create; the scheduler itself only merges matchLabelKeys of topology spread constraints).
// About 30 % of the cases carry DRA devices and claims (gen_dra_test.go). Left out, because
// devicelet refuses them by design: volumes that are PVCs, claims from templates and
// scheduling gates.

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/utils/ptr"
)

// Case is one scheduling question, in the `devicelet schedule -f` case format.
type Case struct {
	Name                   string                          `json:"name"`
	Config                 json.RawMessage                 `json:"config,omitempty"`
	Nodes                  []*v1.Node                      `json:"nodes"`
	Pods                   []*v1.Pod                       `json:"pods"`
	Pod                    *v1.Pod                         `json:"pod"`
	Namespaces             []*v1.Namespace                 `json:"namespaces"`
	PDBs                   []*policyv1.PodDisruptionBudget `json:"podDisruptionBudgets"`
	Services               []*v1.Service                   `json:"services,omitempty"`
	ReplicaSets            []*appsv1.ReplicaSet            `json:"replicaSets,omitempty"`
	StatefulSets           []*appsv1.StatefulSet           `json:"statefulSets,omitempty"`
	ReplicationControllers []*v1.ReplicationController     `json:"replicationControllers,omitempty"`
	DeviceClasses          []*resourceapi.DeviceClass      `json:"deviceClasses,omitempty"`
	ResourceSlices         []*resourceapi.ResourceSlice    `json:"resourceSlices,omitempty"`
	ResourceClaims         []*resourceapi.ResourceClaim    `json:"resourceClaims,omitempty"`
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.Intn(len(xs))] }

// chance is true with probability 1/n.
func chance(r *rand.Rand, n int) bool { return r.Intn(n) == 0 }

// The label keys the cases use.
const (
	hostnameKey = "kubernetes.io/hostname"
	zoneKey     = "topology.kubernetes.io/zone"
	diskKey     = "disk"
	rankKey     = "example.com/rank" // an integer, for Gt and Lt
	fooResource = v1.ResourceName("example.com/foo")
)

var namespaceNames = []string{"default", "ns1", "ns2"}

// images is the pool both nodes and pods draw from: tagged, untagged (":latest" implied),
// with and without a registry.
var images = []string{
	"nginx:1.25", "nginx", "redis:7", "registry.k8s.io/pause:3.10", "busybox:latest", "busybox",
	"example.com/app:v1", "example.com/app:v2", "docker.io/library/postgres:16", "quay.io/prom/node-exporter:v1.8.0",
}

// baseTime is the start time of the oldest bound pod (fixed, so cases are reproducible).
var baseTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func quantity(s string) resource.Quantity { return resource.MustParse(s) }

// genCase draws one case.
func genCase(r *rand.Rand, name string) *Case {
	c := &Case{Name: name}
	c.Namespaces = genNamespaces()
	nNodes := 2 + r.Intn(11)
	for i := 1; i <= nNodes; i++ {
		c.Nodes = append(c.Nodes, genNode(r, fmt.Sprintf("n%d", i)))
	}
	uid := 0
	nextUID := func() types.UID {
		uid++
		return types.UID(fmt.Sprintf("%s-uid-%d", name, uid))
	}
	start := baseTime
	for _, n := range c.Nodes {
		usedPorts := map[string]bool{}
		for j := r.Intn(6); j > 0; j-- {
			start = start.Add(time.Duration(1+r.Intn(600)) * time.Second)
			p := genExistingPod(r, fmt.Sprintf("p%d", len(c.Pods)+1), nextUID(), n.Name, start, usedPorts)
			c.Pods = append(c.Pods, p)
		}
	}
	c.Pod = genIncomingPod(r, c, nextUID())
	for i := r.Intn(4); i > 0; i-- {
		c.PDBs = append(c.PDBs, genPDB(r, fmt.Sprintf("pdb%d", i)))
	}
	if chance(r, 2) {
		c.Config = genConfig(r)
	}
	genDRA(r, c, nextUID)
	return c
}

func genNamespaces() []*v1.Namespace {
	labels := map[string]map[string]string{
		"default": {},
		"ns1":     {"team": "a", "env": "prod"},
		"ns2":     {"team": "b"},
	}
	var out []*v1.Namespace
	for _, n := range namespaceNames {
		l := map[string]string{"kubernetes.io/metadata.name": n}
		for k, v := range labels[n] {
			l[k] = v
		}
		out = append(out, &v1.Namespace{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: n, Labels: l, UID: types.UID("ns-" + n)},
		})
	}
	return out
}

func genNode(r *rand.Rand, name string) *v1.Node {
	labels := map[string]string{hostnameKey: name, "kubernetes.io/os": "linux"}
	if !chance(r, 8) {
		labels[zoneKey] = pick(r, "z1", "z2", "z3")
	}
	if !chance(r, 4) {
		labels[diskKey] = pick(r, "ssd", "hdd")
	}
	if chance(r, 2) {
		labels[rankKey] = strconv.Itoa(1 + r.Intn(9))
	}
	alloc := v1.ResourceList{
		v1.ResourceCPU:    quantity(pick(r, "2", "4", "8", "16", "1500m", "3500m", "6")),
		v1.ResourceMemory: quantity(pick(r, "2Gi", "4Gi", "8Gi", "16Gi", "3000Mi", "32Gi")),
		v1.ResourcePods:   *resource.NewQuantity(int64(3+r.Intn(8)), resource.DecimalSI),
	}
	if !chance(r, 10) {
		alloc[v1.ResourceEphemeralStorage] = quantity(pick(r, "10Gi", "50Gi", "2Gi"))
	}
	if chance(r, 3) {
		alloc[fooResource] = *resource.NewQuantity(int64(1+r.Intn(4)), resource.DecimalSI)
	}
	n := &v1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, UID: types.UID("node-" + name)},
		Status: v1.NodeStatus{
			Capacity:    alloc.DeepCopy(),
			Allocatable: alloc,
			Conditions:  []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
		},
	}
	for i := r.Intn(3); i > 0 && chance(r, 3); i-- {
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{
			Key:    pick(r, "dedicated", "gpu", "maintenance", "example.com/k"),
			Value:  pick(r, "a", "b", ""),
			Effect: pick(r, v1.TaintEffectNoSchedule, v1.TaintEffectNoExecute, v1.TaintEffectPreferNoSchedule),
		})
	}
	if chance(r, 15) {
		// As the node lifecycle controller leaves a cordoned node: the flag and its taint
		// (sometimes only the flag, as just after kubectl cordon).
		n.Spec.Unschedulable = true
		if !chance(r, 3) {
			n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule})
		}
	}
	if chance(r, 2) {
		for _, i := range r.Perm(len(images))[:1+r.Intn(4)] {
			img := v1.ContainerImage{Names: []string{images[i]}, SizeBytes: int64(10+r.Intn(1990)) * 1000 * 1000}
			if chance(r, 3) {
				img.Names = append(img.Names, images[i]+"@sha256:"+fmt.Sprintf("%064x", i))
			}
			n.Status.Images = append(n.Status.Images, img)
		}
	}
	return n
}

func genLabels(r *rand.Rand) map[string]string {
	l := map[string]string{}
	if !chance(r, 6) {
		l["app"] = pick(r, "a", "b", "c")
	}
	if chance(r, 2) {
		l["tier"] = pick(r, "x", "y")
	}
	return l
}

// genRequests draws a container's requests (sometimes none).
func genRequests(r *rand.Rand, big bool) v1.ResourceRequirements {
	if chance(r, 6) {
		return v1.ResourceRequirements{}
	}
	req := v1.ResourceList{}
	cpus := []string{"100m", "250m", "500m", "1", "1500m", "2"}
	mems := []string{"64Mi", "128Mi", "512Mi", "1Gi", "2Gi", "3Gi"}
	if big && chance(r, 4) {
		cpus = append(cpus, "4", "8", "12")
		mems = append(mems, "6Gi", "12Gi", "20Gi")
	}
	if !chance(r, 8) {
		req[v1.ResourceCPU] = quantity(pick(r, cpus...))
	}
	if !chance(r, 8) {
		req[v1.ResourceMemory] = quantity(pick(r, mems...))
	}
	if chance(r, 8) {
		req[v1.ResourceEphemeralStorage] = quantity(pick(r, "1Gi", "5Gi"))
	}
	if chance(r, 12) {
		req[fooResource] = *resource.NewQuantity(int64(1+r.Intn(2)), resource.DecimalSI)
	}
	res := v1.ResourceRequirements{Requests: req}
	if chance(r, 4) {
		// Limits equal to the requests (limits alone do not matter to the scheduler).
		res.Limits = req.DeepCopy()
	}
	return res
}

func genContainers(r *rand.Rand, big bool) (containers, inits []v1.Container) {
	for i := 0; i < 1+r.Intn(2); i++ {
		c := v1.Container{Name: fmt.Sprintf("c%d", i), Image: pick(r, images...), Resources: genRequests(r, big)}
		containers = append(containers, c)
	}
	if chance(r, 5) {
		for i := 0; i < 1+r.Intn(2); i++ {
			c := v1.Container{Name: fmt.Sprintf("init%d", i), Image: pick(r, images...), Resources: genRequests(r, big)}
			if chance(r, 3) {
				c.RestartPolicy = ptr.To(v1.ContainerRestartPolicyAlways) // a sidecar
			}
			inits = append(inits, c)
		}
	}
	return containers, inits
}

// genHostPorts sometimes gives the pod host ports. used holds the ports (protocol/port) already
// taken on the pod's node, or is nil for the pod to schedule: a port is never used twice within
// a pod (API validation), nor by two bound pods of one node (the kubelet refuses the second).
func genHostPorts(r *rand.Rand, containers []v1.Container, used map[string]bool) {
	if !chance(r, 5) {
		return
	}
	mine := map[string]bool{}
	for i := r.Intn(2); i >= 0; i-- {
		p := v1.ContainerPort{
			ContainerPort: int32(8000 + r.Intn(100)),
			HostPort:      pick[int32](r, 80, 8080, 9090),
			Protocol:      pick(r, v1.ProtocolTCP, v1.ProtocolTCP, v1.ProtocolUDP),
		}
		if chance(r, 4) {
			p.HostIP = pick(r, "0.0.0.0", "127.0.0.1", "10.0.0.1")
		}
		key := fmt.Sprintf("%s/%d", p.Protocol, p.HostPort)
		if mine[key] || used[key] {
			continue
		}
		mine[key] = true
		c := &containers[r.Intn(len(containers))]
		c.Ports = append(c.Ports, p)
	}
	if used != nil {
		for k := range mine {
			used[k] = true
		}
	}
}

// genSelector draws a label selector over app and tier.
func genSelector(r *rand.Rand) *metav1.LabelSelector {
	switch r.Intn(5) {
	case 0:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{pick(r, "a", "b"), pick(r, "b", "c")}},
		}}
	case 1:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "tier", Operator: pick(r, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist)},
		}}
	case 2:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": pick(r, "a", "b", "c"), "tier": pick(r, "x", "y")}}
	default:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": pick(r, "a", "b", "c")}}
	}
}

// genPodAffinityTerm draws one term. podLabels are the labels of the pod that carries it:
// matchLabelKeys and mismatchLabelKeys are merged into the selector as the API server does.
func genPodAffinityTerm(r *rand.Rand, podLabels map[string]string) v1.PodAffinityTerm {
	t := v1.PodAffinityTerm{
		LabelSelector: genSelector(r),
		TopologyKey:   pick(r, hostnameKey, zoneKey),
	}
	switch r.Intn(6) {
	case 0:
		t.Namespaces = []string{pick(r, namespaceNames...), pick(r, namespaceNames...)}
	case 1:
		t.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": pick(r, "a", "b")}}
	case 2:
		t.NamespaceSelector = &metav1.LabelSelector{} // all namespaces
	}
	if chance(r, 6) {
		if _, inSelector := t.LabelSelector.MatchLabels["tier"]; !inSelector {
			t.MatchLabelKeys = []string{"tier"}
		}
	} else if chance(r, 10) {
		if _, inSelector := t.LabelSelector.MatchLabels["tier"]; !inSelector {
			t.MismatchLabelKeys = []string{"tier"}
		}
	}
	mergeLabelKeys(t.LabelSelector, t.MatchLabelKeys, metav1.LabelSelectorOpIn, podLabels)
	mergeLabelKeys(t.LabelSelector, t.MismatchLabelKeys, metav1.LabelSelectorOpNotIn, podLabels)
	return t
}

// mergeLabelKeys adds `key op (value of the pod's label)` for each key the pod has: what the
// API server's pod strategy does to matchLabelKeys and mismatchLabelKeys on create.
func mergeLabelKeys(sel *metav1.LabelSelector, keys []string, op metav1.LabelSelectorOperator, podLabels map[string]string) {
	for _, k := range keys {
		if v, ok := podLabels[k]; ok {
			sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: k, Operator: op, Values: []string{v}})
		}
	}
}

// genPodAffinity draws required and preferred pod affinity and anti-affinity; rare is the
// 1-in-n chance of each part.
func genPodAffinity(r *rand.Rand, labels map[string]string, rare int) (*v1.PodAffinity, *v1.PodAntiAffinity) {
	var aff *v1.PodAffinity
	var anti *v1.PodAntiAffinity
	weighted := func() v1.WeightedPodAffinityTerm {
		return v1.WeightedPodAffinityTerm{Weight: int32(1 + r.Intn(100)), PodAffinityTerm: genPodAffinityTerm(r, labels)}
	}
	if chance(r, rare) {
		aff = &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{genPodAffinityTerm(r, labels)}}
	}
	if chance(r, rare) {
		if aff == nil {
			aff = &v1.PodAffinity{}
		}
		for i := 1 + r.Intn(2); i > 0; i-- {
			aff.PreferredDuringSchedulingIgnoredDuringExecution = append(aff.PreferredDuringSchedulingIgnoredDuringExecution, weighted())
		}
	}
	if chance(r, rare) {
		anti = &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{genPodAffinityTerm(r, labels)}}
	}
	if chance(r, rare) {
		if anti == nil {
			anti = &v1.PodAntiAffinity{}
		}
		for i := 1 + r.Intn(2); i > 0; i-- {
			anti.PreferredDuringSchedulingIgnoredDuringExecution = append(anti.PreferredDuringSchedulingIgnoredDuringExecution, weighted())
		}
	}
	return aff, anti
}

func genExistingPod(r *rand.Rand, name string, uid types.UID, node string, start time.Time, usedPorts map[string]bool) *v1.Pod {
	labels := genLabels(r)
	containers, inits := genContainers(r, false)
	genHostPorts(r, containers, usedPorts)
	p := &v1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: pick(r, namespaceNames...), UID: uid, Labels: labels,
			CreationTimestamp: metav1.NewTime(start.Add(-time.Second)),
		},
		Spec: v1.PodSpec{
			NodeName:       node,
			Containers:     containers,
			InitContainers: inits,
			Priority:       ptr.To(pick[int32](r, 0, 0, 100, 1000)),
			SchedulerName:  v1.DefaultSchedulerName,
		},
		Status: v1.PodStatus{Phase: v1.PodRunning, StartTime: ptr.To(metav1.NewTime(start))},
	}
	if chance(r, 8) {
		p.Spec.Overhead = v1.ResourceList{v1.ResourceCPU: quantity("100m"), v1.ResourceMemory: quantity("64Mi")}
	}
	aff, anti := genPodAffinity(r, labels, 7)
	if aff != nil || anti != nil {
		p.Spec.Affinity = &v1.Affinity{PodAffinity: aff, PodAntiAffinity: anti}
	}
	return p
}

// genNodeSelectorTerm draws a term of one or two requirements.
func genNodeSelectorTerm(r *rand.Rand, nodes []*v1.Node) v1.NodeSelectorTerm {
	var t v1.NodeSelectorTerm
	for i := 1 + r.Intn(2); i > 0; i-- {
		switch r.Intn(8) {
		case 0:
			t.MatchExpressions = append(t.MatchExpressions, v1.NodeSelectorRequirement{Key: diskKey, Operator: v1.NodeSelectorOpIn, Values: []string{pick(r, "ssd", "hdd")}})
		case 1:
			t.MatchExpressions = append(t.MatchExpressions, v1.NodeSelectorRequirement{Key: zoneKey, Operator: v1.NodeSelectorOpNotIn, Values: []string{pick(r, "z1", "z2", "z3")}})
		case 2:
			t.MatchExpressions = append(t.MatchExpressions, v1.NodeSelectorRequirement{Key: pick(r, diskKey, zoneKey, rankKey), Operator: pick(r, v1.NodeSelectorOpExists, v1.NodeSelectorOpDoesNotExist)})
		case 3:
			t.MatchExpressions = append(t.MatchExpressions, v1.NodeSelectorRequirement{Key: rankKey, Operator: pick(r, v1.NodeSelectorOpGt, v1.NodeSelectorOpLt), Values: []string{strconv.Itoa(1 + r.Intn(9))}})
		case 4:
			// By name; sometimes a node that does not exist, sometimes twice (In twice with
			// different names is a conflict NodeAffinity's PreFilter rejects).
			name := pick(r, nodes...).Name
			if chance(r, 8) {
				name = "gone"
			}
			t.MatchFields = append(t.MatchFields, v1.NodeSelectorRequirement{Key: "metadata.name", Operator: pick(r, v1.NodeSelectorOpIn, v1.NodeSelectorOpNotIn), Values: []string{name}})
			if chance(r, 4) {
				t.MatchFields = append(t.MatchFields, v1.NodeSelectorRequirement{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{pick(r, nodes...).Name}})
			}
		case 5:
			t.MatchExpressions = append(t.MatchExpressions, v1.NodeSelectorRequirement{Key: hostnameKey, Operator: v1.NodeSelectorOpIn, Values: []string{pick(r, nodes...).Name, pick(r, nodes...).Name}})
		default:
			t.MatchExpressions = append(t.MatchExpressions, v1.NodeSelectorRequirement{Key: zoneKey, Operator: v1.NodeSelectorOpIn, Values: []string{pick(r, "z1", "z2"), "z3"}})
		}
	}
	return t
}

// genTolerations tolerates some of the taints the nodes carry, and sometimes taints they don't.
func genTolerations(r *rand.Rand, nodes []*v1.Node) []v1.Toleration {
	var out []v1.Toleration
	for _, n := range nodes {
		for _, taint := range n.Spec.Taints {
			if chance(r, 3) {
				continue
			}
			t := v1.Toleration{Key: taint.Key, Effect: taint.Effect}
			switch r.Intn(4) {
			case 0:
				t.Operator = v1.TolerationOpExists
			case 1:
				t.Operator, t.Effect = v1.TolerationOpExists, "" // every effect
			default:
				t.Operator, t.Value = v1.TolerationOpEqual, pick(r, taint.Value, taint.Value, "a")
			}
			if t.Effect == v1.TaintEffectNoExecute && chance(r, 2) {
				t.TolerationSeconds = ptr.To(int64(300))
			}
			out = append(out, t)
		}
	}
	if chance(r, 10) {
		out = append(out, v1.Toleration{Operator: v1.TolerationOpExists}) // tolerates everything
	}
	if chance(r, 8) {
		out = append(out, v1.Toleration{Key: v1.TaintNodeUnschedulable, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoSchedule})
	}
	return out
}

func genSpreadConstraint(r *rand.Rand, labels map[string]string) v1.TopologySpreadConstraint {
	c := v1.TopologySpreadConstraint{
		MaxSkew:           int32(1 + r.Intn(3)),
		TopologyKey:       pick(r, hostnameKey, zoneKey),
		WhenUnsatisfiable: pick(r, v1.DoNotSchedule, v1.ScheduleAnyway),
		LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": pick(r, "a", "b", "c")}},
	}
	if v, ok := labels["app"]; ok && chance(r, 2) {
		c.LabelSelector.MatchLabels["app"] = v // spread with its own kind
	}
	if c.WhenUnsatisfiable == v1.DoNotSchedule && chance(r, 4) {
		c.MinDomains = ptr.To(int32(1 + r.Intn(4)))
	}
	if chance(r, 4) {
		c.NodeAffinityPolicy = ptr.To(pick(r, v1.NodeInclusionPolicyHonor, v1.NodeInclusionPolicyIgnore))
	}
	if chance(r, 4) {
		c.NodeTaintsPolicy = ptr.To(pick(r, v1.NodeInclusionPolicyHonor, v1.NodeInclusionPolicyIgnore))
	}
	if chance(r, 5) {
		c.MatchLabelKeys = []string{"tier"}
		mergeLabelKeys(c.LabelSelector, c.MatchLabelKeys, metav1.LabelSelectorOpIn, labels)
	}
	return c
}

func genIncomingPod(r *rand.Rand, c *Case, uid types.UID) *v1.Pod {
	labels := genLabels(r)
	containers, inits := genContainers(r, true)
	genHostPorts(r, containers, nil)
	p := &v1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "incoming", Namespace: pick(r, namespaceNames...), UID: uid, Labels: labels,
			CreationTimestamp: metav1.NewTime(baseTime.Add(24 * time.Hour)),
		},
		Spec: v1.PodSpec{
			Containers:     containers,
			InitContainers: inits,
			Priority:       ptr.To(pick[int32](r, 0, 100, 1000, 2000)),
			SchedulerName:  v1.DefaultSchedulerName,
			Tolerations:    genTolerations(r, c.Nodes),
		},
		Status: v1.PodStatus{Phase: v1.PodPending},
	}
	if chance(r, 5) {
		p.Spec.PreemptionPolicy = ptr.To(v1.PreemptNever)
	}
	if chance(r, 10) {
		p.Spec.Overhead = v1.ResourceList{v1.ResourceCPU: quantity("250m")}
	}
	if chance(r, 30) {
		// Pod-level resources (beta, on by default in 1.36): requests at least the containers'
		// (API validation), sometimes more.
		agg := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{SkipPodLevelResources: true})
		cpu, mem := agg[v1.ResourceCPU], agg[v1.ResourceMemory]
		cpu.Add(quantity(pick(r, "0", "500m", "2")))
		mem.Add(quantity(pick(r, "0", "512Mi", "2Gi")))
		p.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: cpu, v1.ResourceMemory: mem}}
	}
	if chance(r, 6) {
		p.Spec.NodeSelector = map[string]string{}
		if chance(r, 2) {
			p.Spec.NodeSelector[diskKey] = pick(r, "ssd", "hdd")
		} else {
			p.Spec.NodeSelector[zoneKey] = pick(r, "z1", "z2", "z3")
		}
	}
	var na *v1.NodeAffinity
	if chance(r, 5) {
		na = &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{}}
		for i := 1 + r.Intn(2); i > 0; i-- {
			t := &na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			*t = append(*t, genNodeSelectorTerm(r, c.Nodes))
		}
	}
	if chance(r, 40) {
		// Only terms that name nodes, none of them satisfiable: NodeAffinity's PreFilter
		// rejects the pod outright.
		a, b := pick(r, c.Nodes...).Name, "gone"
		na = &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchFields: []v1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{a}},
				{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{b}},
			},
		}}}}
	}
	if chance(r, 4) {
		if na == nil {
			na = &v1.NodeAffinity{}
		}
		for i := 1 + r.Intn(3); i > 0; i-- {
			na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution,
				v1.PreferredSchedulingTerm{Weight: int32(1 + r.Intn(100)), Preference: genNodeSelectorTerm(r, c.Nodes)})
		}
	}
	aff, anti := genPodAffinity(r, labels, 4)
	if na != nil || aff != nil || anti != nil {
		p.Spec.Affinity = &v1.Affinity{NodeAffinity: na, PodAffinity: aff, PodAntiAffinity: anti}
	}
	switch {
	case chance(r, 3):
		for i := 1 + r.Intn(2); i > 0; i-- {
			p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, genSpreadConstraint(r, labels))
		}
		// Two constraints on the same key and policy are refused by validation.
		if len(p.Spec.TopologySpreadConstraints) == 2 {
			a, b := p.Spec.TopologySpreadConstraints[0], p.Spec.TopologySpreadConstraints[1]
			if a.TopologyKey == b.TopologyKey && a.WhenUnsatisfiable == b.WhenUnsatisfiable {
				p.Spec.TopologySpreadConstraints = p.Spec.TopologySpreadConstraints[:1]
			}
		}
	case chance(r, 2) && labels["app"] != "":
		addSpreadingOwners(r, c, p)
	}
	return p
}

// addSpreadingOwners gives the pod an owner (ReplicaSet, StatefulSet or ReplicationController)
// and sometimes a Service selecting it: the objects the system default spreading
// (PodTopologySpread without constraints) derives its selector from.
func addSpreadingOwners(r *rand.Rand, c *Case, p *v1.Pod) {
	ns, app := p.Namespace, p.Labels["app"]
	selector := map[string]string{"app": app}
	owner := metav1.OwnerReference{Name: "owner-" + app, Controller: ptr.To(true), UID: types.UID("owner-" + app)}
	switch r.Intn(4) {
	case 0:
		owner.APIVersion, owner.Kind = "apps/v1", "StatefulSet"
		c.StatefulSets = append(c.StatefulSets, &appsv1.StatefulSet{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
			ObjectMeta: metav1.ObjectMeta{Name: owner.Name, Namespace: ns, UID: owner.UID},
			Spec:       appsv1.StatefulSetSpec{Selector: &metav1.LabelSelector{MatchLabels: selector}},
		})
	case 1:
		owner.APIVersion, owner.Kind = "v1", "ReplicationController"
		c.ReplicationControllers = append(c.ReplicationControllers, &v1.ReplicationController{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ReplicationController"},
			ObjectMeta: metav1.ObjectMeta{Name: owner.Name, Namespace: ns, UID: owner.UID},
			Spec:       v1.ReplicationControllerSpec{Selector: selector},
		})
	default:
		owner.APIVersion, owner.Kind = "apps/v1", "ReplicaSet"
		c.ReplicaSets = append(c.ReplicaSets, &appsv1.ReplicaSet{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
			ObjectMeta: metav1.ObjectMeta{Name: owner.Name, Namespace: ns, UID: owner.UID},
			Spec:       appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: selector}},
		})
	}
	p.OwnerReferences = []metav1.OwnerReference{owner}
	if !chance(r, 3) {
		svcSel := map[string]string{"app": app}
		if t, ok := p.Labels["tier"]; ok && chance(r, 3) {
			svcSel["tier"] = t
		}
		c.Services = append(c.Services, &v1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: "svc-" + app, Namespace: ns, UID: types.UID("svc-" + app)},
			Spec:       v1.ServiceSpec{Selector: svcSel},
		})
	}
	if chance(r, 4) {
		// A service in another namespace, which must not count.
		other := namespaceNames[(indexOf(namespaceNames, ns)+1)%len(namespaceNames)]
		c.Services = append(c.Services, &v1.Service{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: "svc-other", Namespace: other, UID: "svc-other"},
			Spec:       v1.ServiceSpec{Selector: map[string]string{"tier": "x"}},
		})
	}
}

func indexOf(xs []string, x string) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}

func genPDB(r *rand.Rand, name string) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pick(r, namespaceNames...), UID: types.UID("pdb-" + name)},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": pick(r, "a", "b", "c")}},
		},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: int32(r.Intn(2))},
	}
}

// scorePlugins are the default profile's score plugins and their default weights.
var scorePlugins = []struct {
	name   string
	weight int
}{
	{"TaintToleration", 3}, {"NodeAffinity", 2}, {"NodeResourcesFit", 1}, {"PodTopologySpread", 2},
	{"InterPodAffinity", 2}, {"NodeResourcesBalancedAllocation", 1}, {"ImageLocality", 1},
}

// genConfig draws a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1, one profile).
func genConfig(r *rand.Rand) json.RawMessage {
	profile := map[string]any{"schedulerName": v1.DefaultSchedulerName}
	var pluginConfig []map[string]any
	args := func(name string, a map[string]any) {
		pluginConfig = append(pluginConfig, map[string]any{"name": name, "args": a})
	}
	if chance(r, 2) {
		resources := []map[string]any{{"name": "cpu", "weight": 1 + r.Intn(5)}, {"name": "memory", "weight": 1 + r.Intn(5)}}
		if chance(r, 3) {
			resources = append(resources, map[string]any{"name": string(fooResource), "weight": 1 + r.Intn(5)})
		}
		if chance(r, 4) {
			resources = resources[1:]
		}
		strategy := map[string]any{"type": pick(r, "LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"), "resources": resources}
		if strategy["type"] == "RequestedToCapacityRatio" {
			shape := []map[string]any{{"utilization": 0, "score": r.Intn(11)}}
			if chance(r, 2) {
				shape = append(shape, map[string]any{"utilization": 20 + r.Intn(60), "score": r.Intn(11)})
			}
			shape = append(shape, map[string]any{"utilization": 100, "score": r.Intn(11)})
			strategy["requestedToCapacityRatio"] = map[string]any{"shape": shape}
		}
		args("NodeResourcesFit", map[string]any{"scoringStrategy": strategy})
	}
	if chance(r, 3) {
		resources := []map[string]any{{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}}
		if chance(r, 2) {
			resources = append(resources, map[string]any{"name": string(fooResource), "weight": 1})
		}
		args("NodeResourcesBalancedAllocation", map[string]any{"resources": resources})
	}
	if chance(r, 2) {
		args("InterPodAffinity", map[string]any{
			"hardPodAffinityWeight":              pick(r, 0, 1, 10, 100),
			"ignorePreferredTermsOfExistingPods": chance(r, 2),
		})
	}
	if chance(r, 12) {
		// NodeAffinityArgs.addedAffinity: required and preferred terms added to every pod.
		added := map[string]any{}
		if chance(r, 2) {
			added["requiredDuringSchedulingIgnoredDuringExecution"] = map[string]any{"nodeSelectorTerms": []any{
				map[string]any{"matchExpressions": []any{map[string]any{"key": diskKey, "operator": "In", "values": []string{"ssd", "hdd"}}}},
				map[string]any{"matchExpressions": []any{map[string]any{"key": zoneKey, "operator": "Exists"}}},
			}}
		}
		added["preferredDuringSchedulingIgnoredDuringExecution"] = []any{map[string]any{
			"weight":     1 + r.Intn(100),
			"preference": map[string]any{"matchExpressions": []any{map[string]any{"key": diskKey, "operator": "In", "values": []string{pick(r, "ssd", "hdd")}}}},
		}}
		args("NodeAffinity", map[string]any{"addedAffinity": added})
	}
	if chance(r, 3) {
		var constraints []map[string]any
		for _, key := range r.Perm(2)[:1+r.Intn(2)] {
			constraints = append(constraints, map[string]any{
				"maxSkew":           1 + r.Intn(3),
				"topologyKey":       []string{hostnameKey, zoneKey}[key],
				"whenUnsatisfiable": pick(r, "ScheduleAnyway", "DoNotSchedule"),
			})
		}
		if chance(r, 5) {
			constraints = nil // List with no constraints: no default spreading at all
		}
		args("PodTopologySpread", map[string]any{"defaultingType": "List", "defaultConstraints": constraints})
	}
	if len(pluginConfig) > 0 {
		profile["pluginConfig"] = pluginConfig
	}
	plugins := map[string]any{}
	if chance(r, 2) {
		// New weights, through multiPoint or through score (which takes precedence).
		var enabled []map[string]any
		for _, i := range r.Perm(len(scorePlugins))[:1+r.Intn(3)] {
			enabled = append(enabled, map[string]any{"name": scorePlugins[i].name, "weight": 1 + r.Intn(10)})
		}
		point := pick(r, "multiPoint", "score")
		plugins[point] = map[string]any{"enabled": enabled}
	}
	if chance(r, 6) {
		plugins["score"] = mergeDisabled(plugins["score"], pick(r, scorePlugins...).name)
	}
	if len(plugins) > 0 {
		profile["plugins"] = plugins
	}
	cfg := map[string]any{
		"apiVersion": "kubescheduler.config.k8s.io/v1",
		"kind":       "KubeSchedulerConfiguration",
		"profiles":   []any{profile},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// mergeDisabled adds a disabled plugin to an extension point's plugin set (nil or a map).
func mergeDisabled(set any, name string) map[string]any {
	m, _ := set.(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	if enabled, ok := m["enabled"].([]map[string]any); ok {
		var kept []map[string]any
		for _, e := range enabled {
			if e["name"] != name {
				kept = append(kept, e)
			}
		}
		m["enabled"] = kept
	}
	m["disabled"] = []map[string]any{{"name": name}}
	return m
}
