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
		"rejected by InterPodAffinity", "rejected by (PreFilterResult)", "prefilter NodeAffinity",
		"scored by TaintToleration", "scored by NodeAffinity", "scored by NodeResourcesFit",
		"scored by PodTopologySpread", "scored by InterPodAffinity", "scored by NodeResourcesBalancedAllocation",
		"scored by ImageLocality", "cases with no feasible node", "cases with a preemption dry run",
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
