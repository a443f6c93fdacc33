package scheduler

// Checks of the suite itself, which need no devicelet binary: the upstream half runs every
// case and the cases exercise what they are meant to (TestUpstream), and the comparison
// notices a wrong answer (TestComparisonCatchesTamperedAnswers).

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestUpstream runs the cases through kube-scheduler's code alone: no case may fail there
// (every generated config is valid, nothing panics), and every plugin the cases are meant to
// exercise must reject some node or score some node differently from 0. With
// SCHEDULER_ORACLE_UPSTREAM_ONLY=1 it also prints the first SCHEDULER_ORACLE_SHOW answers.
func TestUpstream(t *testing.T) {
	cases, how := loadCases(t)
	t.Logf("%s", how)
	results := make([]Result, len(cases))
	for i, c := range cases {
		results[i] = runUpstream(c)
		if results[i].Error != "" {
			t.Errorf("case %s: upstream cannot run it: %s", c.Name, results[i].Error)
		}
	}
	stats := outcomeStats(results)
	t.Logf("upstream outcomes: %s", formatCounts(stats))
	if os.Getenv("SCHEDULER_ORACLE_UPSTREAM_ONLY") != "" {
		for i := 0; i < len(results) && i < envInt("SCHEDULER_ORACLE_SHOW", 5); i++ {
			c, _ := json.Marshal(cases[i])
			r, _ := json.MarshalIndent(results[i], "", "  ")
			t.Logf("case %s:\n%s\nupstream:\n%s", cases[i].Name, c, r)
		}
	}
	if len(cases) < 500 || os.Getenv("SCHEDULER_ORACLE_REPLAY") != "" {
		return // too few cases to expect everything
	}
	want := []string{
		"rejected by NodeUnschedulable", "rejected by TaintToleration", "rejected by NodeAffinity",
		"rejected by NodePorts", "rejected by NodeResourcesFit", "rejected by PodTopologySpread",
		"rejected by InterPodAffinity", "rejected by DynamicResources", "rejected by (PreFilterResult)",
		"prefilter NodeAffinity", "prefilter DynamicResources",
		"scored by TaintToleration", "scored by NodeAffinity", "scored by NodeResourcesFit",
		"scored by PodTopologySpread", "scored by InterPodAffinity", "scored by NodeResourcesBalancedAllocation",
		"scored by ImageLocality", "scored by DynamicResources", "cases with no feasible node", "cases with a preemption dry run",
		"preemption: node fails", "preemption: victims", "preemption: victims violating a PDB",
	}
	for _, w := range want {
		if stats[w] == 0 {
			t.Errorf("no case exercised %q", w)
		}
	}
}

// TestComparisonCatchesTamperedAnswers: upstream's own answers, through JSON as devicelet's
// would come, compare equal; each kind of wrong answer planted in them is reported, and makes
// the case count as differing.
func TestComparisonCatchesTamperedAnswers(t *testing.T) {
	var cases []*Case
	for s := int64(1); s <= 300; s++ {
		cases = append(cases, genCase(rand.New(rand.NewSource(s)), fmt.Sprintf("seed-%d", s)))
	}
	up := make([]Result, len(cases))
	for i, c := range cases {
		up[i] = runUpstream(c)
	}
	if rep := evaluate(cases, up, deepCopyResults(up)); len(rep.differing) != 0 {
		t.Fatalf("identical answers differ: %s; first: %v", rep.summary(), rep.diffs[rep.differing[0]])
	}

	// Each tamper finds a case it applies to and changes devicelet's answer there.
	tampers := []struct {
		kind   string
		tamper func(r *Result) bool
	}{
		{"score", func(r *Result) bool {
			for i := range r.Nodes {
				for p := range r.Nodes[i].Scores {
					r.Nodes[i].Scores[p]++
					r.Nodes[i].Total++
					return true
				}
			}
			return false
		}},
		{"total", func(r *Result) bool {
			for i := range r.Nodes {
				if r.Nodes[i].Rejection == nil {
					r.Nodes[i].Total += 7
					return true
				}
			}
			return false
		}},
		{"feasibility", func(r *Result) bool {
			for i := range r.Nodes {
				if r.Nodes[i].Rejection == nil {
					r.Nodes[i].Rejection = &Status{Plugin: "NodeResourcesFit", Code: "Unschedulable", Reasons: []string{"Insufficient cpu"}}
					return true
				}
			}
			return false
		}},
		{"filter plugin", func(r *Result) bool {
			for i := range r.Nodes {
				if s := r.Nodes[i].Rejection; s != nil && s.Plugin == "TaintToleration" {
					s.Plugin = "NodeAffinity"
					return true
				}
			}
			return false
		}},
		{"filter code", func(r *Result) bool {
			for i := range r.Nodes {
				if s := r.Nodes[i].Rejection; s != nil && s.Code == "Unschedulable" {
					s.Code = "UnschedulableAndUnresolvable"
					return true
				}
			}
			return false
		}},
		{"reasons", func(r *Result) bool {
			for i := range r.Nodes {
				if s := r.Nodes[i].Rejection; s != nil && len(s.Reasons) > 0 {
					s.Reasons[0] += "."
					return true
				}
			}
			return false
		}},
		{"victims", func(r *Result) bool {
			if r.Preemption == nil {
				return false
			}
			for n, pn := range r.Preemption.Nodes {
				if len(pn.Victims) > 0 {
					pn.Victims = pn.Victims[1:]
					if len(pn.Victims) == 0 {
						pn.Victims = []string{"default/somebody-else"}
					}
					r.Preemption.Nodes[n] = pn
					return true
				}
			}
			return false
		}},
		{"pdbViolations", func(r *Result) bool {
			if r.Preemption == nil {
				return false
			}
			for n, pn := range r.Preemption.Nodes {
				if len(pn.Victims) > 0 {
					pn.PDBViolations++
					r.Preemption.Nodes[n] = pn
					return true
				}
			}
			return false
		}},
		{"preemption outcome", func(r *Result) bool {
			if r.Preemption == nil {
				return false
			}
			for n, pn := range r.Preemption.Nodes {
				if pn.Failure != "" {
					r.Preemption.Nodes[n] = PreemptionNode{Victims: []string{"default/p1"}}
					return true
				}
			}
			return false
		}},
		{"preemption", func(r *Result) bool {
			if r.Preemption == nil {
				return false
			}
			r.Preemption = nil
			return true
		}},
		{"node missing", func(r *Result) bool {
			if len(r.Nodes) < 2 || r.PreFilter != nil {
				return false
			}
			r.Nodes = r.Nodes[1:]
			return true
		}},
		{"error", func(r *Result) bool {
			r.Error = "refused"
			return true
		}},
	}
	for _, tc := range tampers {
		dl := deepCopyResults(up)
		at := -1
		for i := range dl {
			if tc.tamper(&dl[i]) {
				at = i
				break
			}
		}
		if at < 0 {
			t.Errorf("%s: no case to tamper with", tc.kind)
			continue
		}
		rep := evaluate(cases, up, dl)
		if len(rep.differing) != 1 || rep.differing[0] != at {
			t.Errorf("%s: tampered case %s, differing cases %v", tc.kind, cases[at].Name, rep.differing)
			continue
		}
		found := false
		for kind := range rep.kinds {
			if strings.HasPrefix(kind, tc.kind) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: reported as %v", tc.kind, rep.diffs[at])
		}
	}

	// A known divergence that matches the difference explains it away.
	dl := deepCopyResults(up)
	dl[0].Error = "refused"
	saved := knownDivergences
	t.Cleanup(func() { knownDivergences = saved })
	knownDivergences = append(knownDivergences, struct {
		name, reason string
		match        func(c *Case, d Diff, upstream, devicelet *Result) bool
	}{"test", "a test entry", func(c *Case, d Diff, _, _ *Result) bool { return d.Kind == "error" }})
	if rep := evaluate(cases, up, dl); len(rep.differing) != 0 || rep.known["test"] != 1 {
		t.Errorf("known divergence not applied: %s", rep.summary())
	}
}

// TestDRADivergenceIsNarrow: the known divergence for preemption for devices explains a node
// devicelet dry-runs only where upstream's DynamicResources Filter rejected it with "cannot
// allocate all claims", and nothing about a node some other filter rejected.
func TestDRADivergenceIsNarrow(t *testing.T) {
	var cases []*Case
	for s := int64(1); s <= 300; s++ {
		cases = append(cases, genCase(rand.New(rand.NewSource(s)), fmt.Sprintf("seed-%d", s)))
	}
	up := make([]Result, len(cases))
	for i, c := range cases {
		up[i] = runUpstream(c)
	}
	// plant makes devicelet dry-run a node upstream does not, in the first DRA case with such
	// a node whose upstream rejection satisfies want, and returns the report.
	plant := func(want func(s *Status) bool) (*report, string) {
		dl := deepCopyResults(up)
		for i, c := range cases {
			if len(c.Pod.Spec.ResourceClaims) == 0 || dl[i].Preemption == nil {
				continue
			}
			for _, n := range dl[i].Nodes {
				if _, ran := dl[i].Preemption.Nodes[n.Name]; ran || !want(n.Rejection) {
					continue
				}
				dl[i].Preemption.Nodes[n.Name] = PreemptionNode{Victims: []string{"default/p1"}}
				return evaluate(cases, up, dl), c.Name
			}
		}
		t.Fatal("no case to plant the difference in")
		return nil, ""
	}
	rep, name := plant(draCannotAllocate)
	if len(rep.differing) != 0 || rep.known["dra-preemption-frees-devices"] != 1 {
		t.Errorf("%s: a node rejected by DynamicResources dry-run by devicelet only: %s", name, rep.summary())
	}
	rep, name = plant(func(s *Status) bool {
		return s != nil && s.Plugin != "DynamicResources" && s.Code == "UnschedulableAndUnresolvable"
	})
	if len(rep.differing) != 1 || rep.kinds["preemption nodes"] != 1 {
		t.Errorf("%s: a node rejected by another plugin dry-run by devicelet only: %s", name, rep.summary())
	}

	// Where upstream's dry run fails for want of devices, devicelet's victims are explained
	// only if evicting them frees devices on that node.
	for _, frees := range []bool{true, false} {
		dl := deepCopyResults(up)
		planted := ""
	search:
		for i, c := range cases {
			if dl[i].Preemption == nil {
				continue
			}
			for node, pn := range dl[i].Preemption.Nodes {
				if pn.Failure != draCannotAllocateReason {
					continue
				}
				for _, p := range c.Pods {
					victim := p.Namespace + "/" + p.Name
					if p.Spec.NodeName == node && victimsFreeDevices(c, node, []string{victim}) == frees {
						dl[i].Preemption.Nodes[node] = PreemptionNode{Victims: []string{victim}}
						planted = c.Name
						break search
					}
				}
			}
		}
		if planted == "" {
			t.Fatalf("no case to plant victims (freeing devices: %v) in", frees)
		}
		rep := evaluate(cases, up, dl)
		if frees && (len(rep.differing) != 0 || rep.known["dra-preemption-frees-devices"] != 1) {
			t.Errorf("%s: victims freeing devices where upstream cannot: %s", planted, rep.summary())
		}
		if !frees && (len(rep.differing) != 1 || rep.kinds["preemption outcome"] != 1) {
			t.Errorf("%s: victims freeing no device where upstream cannot allocate: %s", planted, rep.summary())
		}
	}
}

// TestUpstreamSeesAllocatedDevices: the DRA manager over the never-started informers knows the
// slices, the classes and the claims, allocated ones included: one node with one device, the
// pod asks for one; free, the node fits (and the prioritized list scores); held by a bound
// pod's claim, DynamicResources rejects the node.
func TestUpstreamSeesAllocatedDevices(t *testing.T) {
	var c *Case
	for s := int64(1); c == nil; s++ {
		x := genCase(rand.New(rand.NewSource(s)), fmt.Sprintf("seed-%d", s))
		if len(x.DeviceClasses) > 0 {
			c = x
		}
	}
	node := c.Nodes[0]
	node.Spec.Taints, node.Spec.Unschedulable = nil, false
	c.Nodes, c.Pods, c.PDBs, c.Config = c.Nodes[:1], nil, nil, nil
	c.Pod.Spec = v1.PodSpec{
		Containers:    []v1.Container{{Name: "c0", Image: "nginx"}},
		Priority:      ptr.To[int32](0),
		SchedulerName: v1.DefaultSchedulerName,
	}
	c.Services, c.ReplicaSets, c.StatefulSets, c.ReplicationControllers, c.Pod.OwnerReferences = nil, nil, nil, nil, nil
	c.ResourceSlices = []*resourceapi.ResourceSlice{genSlice(rand.New(rand.NewSource(1)), node.Name, 1)}
	c.ResourceClaims = []*resourceapi.ResourceClaim{{
		ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: c.Pod.Namespace, UID: "mine", ResourceVersion: "1"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			FirstAvailable: []resourceapi.DeviceSubRequest{
				{Name: "s0", DeviceClassName: gpuClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
			},
		}}}},
	}}
	usesClaim(c.Pod, "gpu0", "mine")
	res := runUpstream(c)
	if res.Error != "" || len(res.Nodes) != 1 || res.Nodes[0].Rejection != nil || res.Nodes[0].Scores["DynamicResources"] == 0 {
		t.Fatalf("free device: %+v", res)
	}

	holder := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: "default", UID: "holder"},
		Spec: v1.PodSpec{
			NodeName: node.Name, Containers: []v1.Container{{Name: "c0", Image: "nginx"}},
			Priority: ptr.To[int32](0), SchedulerName: v1.DefaultSchedulerName,
		},
		Status: v1.PodStatus{Phase: v1.PodRunning},
	}
	held := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: "default", UID: "held", ResourceVersion: "2"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{
				Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "gpu", Driver: gpuDriver, Pool: node.Name, Device: "gpu-0"},
				}},
				NodeSelector: nodeNameSelector(node.Name),
			},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "holder", UID: "holder"}},
		},
	}
	usesClaim(holder, "gpu", "held")
	c.Pods = []*v1.Pod{holder}
	c.ResourceClaims = append(c.ResourceClaims, held)
	res = runUpstream(c)
	if res.Error != "" || len(res.Nodes) != 1 || !draCannotAllocate(res.Nodes[0].Rejection) {
		t.Fatalf("device held by a bound pod's claim: %+v", res)
	}
}
