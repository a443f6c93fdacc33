package scheduler

// The comparison: every case goes through kube-scheduler's plugins (upstream_test.go) and,
// all in one batch, through `devicelet schedule`; then the PreFilter verdict, each node's
// rejection or scores, and the preemption dry run are compared.
//
// SCHEDULER_ORACLE_CASES=N (default 1000), SCHEDULER_ORACLE_SEED=S (default fixed; `random`
// draws one; case i is drawn from seed S+i and named seed-<S+i>), SCHEDULER_ORACLE_REPLAY=FILE
// runs the cases of a saved case file instead, SCHEDULER_ORACLE_SHOW=N (default 5) prints that
// many differing cases in full, SCHEDULER_ORACLE_SHRINK=N (default 10) shrinks a minimal
// reproducer for that many kinds of difference (0: none), SCHEDULER_ORACLE_KEEP=1 keeps the work directory, SCHEDULER_ORACLE_UPSTREAM_ONLY=1 runs only
// the upstream half (TestUpstream) and skips the comparison.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

const defaultSeed = 20260701

// Diff is one difference between the two answers to a case.
type Diff struct {
	Kind   string // what differs: "filter plugin", "reasons", "score NodeResourcesFit", "victims", ...
	Node   string // the node, where it is about one
	Detail string
}

func (d Diff) String() string {
	if d.Node != "" {
		return fmt.Sprintf("%s on %s: %s", d.Kind, d.Node, d.Detail)
	}
	return fmt.Sprintf("%s: %s", d.Kind, d.Detail)
}

// knownDivergences: places where devicelet differs from kube-scheduler on purpose. Each entry
// says why; match decides whether a difference is that one. A case counts as differing only
// for differences no entry matches.
var knownDivergences = []struct {
	name, reason string
	match        func(c *Case, d Diff, upstream, devicelet *Result) bool
}{
	{
		name: "fit-score-pod-level-resources",
		reason: "NodeResourcesFit's score of a pod with pod-level requests: upstream's scorer " +
			"never sets enablePodLevelResources (NewFit), so it scores the containers' requests " +
			"while the same pod, once bound, counts on its node with its pod-level requests " +
			"(NodeInfo). devicelet scores the pod-level requests, as it counts them (an " +
			"upstream bug fixed; crates/devicelet-scheduler/src/filters/node_resources_fit.rs)",
		match: func(c *Case, d Diff, _, _ *Result) bool {
			return d.Kind == "score NodeResourcesFit" && c.Pod.Spec.Resources != nil &&
				len(c.Pod.Spec.Resources.Requests) > 0
		},
	},
	{
		name: "dra-preemption-frees-devices",
		reason: "preemption for devices (KEP-5690): kube-scheduler 1.36 cannot preempt for " +
			"devices. Every DynamicResources Filter rejection is UnschedulableAndUnresolvable " +
			"(dynamicresources.go statusUnschedulable), so a node rejected with \"cannot allocate " +
			"all claims\" is never a preemption candidate (Evaluator.Preempt takes the nodes " +
			"whose status is Unschedulable), and the dry run on another candidate " +
			"(SelectVictimsOnNode) removes victims but never the devices of their claims " +
			"(DynamicResources has no PreFilterExtensions; its allocator's allocated devices are " +
			"fixed in PreFilter). devicelet makes such a node a candidate and returns the devices " +
			"of every claim whose reservedFor consumers are all victims " +
			"(crates/devicelet-scheduler/src/preemption/mod.rs might_help). Matched: a " +
			"DynamicResources \"cannot allocate all claims\" rejection that is Unschedulable in " +
			"devicelet, a node devicelet dry-runs that upstream does not because of that " +
			"rejection, and a node where upstream's dry run fails with \"cannot allocate all " +
			"claims\" while devicelet finds victims of which some free devices on that node",
		match: func(c *Case, d Diff, up, dl *Result) bool {
			if len(c.Pod.Spec.ResourceClaims) == 0 {
				return false
			}
			switch d.Kind {
			case "filter code":
				u, l := nodeRejection(up, d.Node), nodeRejection(dl, d.Node)
				return draCannotAllocate(u) && u.Code == "UnschedulableAndUnresolvable" &&
					draCannotAllocate(l) && l.Code == "Unschedulable"
			case "preemption nodes":
				if up.Preemption == nil || dl.Preemption == nil {
					return false
				}
				_, upRuns := up.Preemption.Nodes[d.Node]
				_, dlRuns := dl.Preemption.Nodes[d.Node]
				return !upRuns && dlRuns && draCannotAllocate(nodeRejection(up, d.Node))
			case "preemption outcome":
				if up.Preemption == nil || dl.Preemption == nil {
					return false
				}
				u, l := up.Preemption.Nodes[d.Node], dl.Preemption.Nodes[d.Node]
				return u.Failure == draCannotAllocateReason && l.Failure == "" &&
					victimsFreeDevices(c, d.Node, l.Victims)
			}
			return false
		},
	},
}

// draCannotAllocateReason is DynamicResources' Filter rejection when the allocator finds no
// devices for the pod's claims on a node (dynamicresources.go Filter).
const draCannotAllocateReason = "cannot allocate all claims"

// draCannotAllocate: the status is DynamicResources' "cannot allocate all claims".
func draCannotAllocate(s *Status) bool {
	return s != nil && s.Plugin == "DynamicResources" && slices.Equal(s.Reasons, []string{draCannotAllocateReason})
}

// nodeRejection is an answer's rejection of a node (nil: feasible, or no such node).
func nodeRejection(r *Result, node string) *Status {
	for i := range r.Nodes {
		if r.Nodes[i].Name == node {
			return r.Nodes[i].Rejection
		}
	}
	return nil
}

// victimsFreeDevices: evicting the victims (namespace/name) frees devices on the node, i.e.
// some claim allocated there is reserved for victims only.
func victimsFreeDevices(c *Case, node string, victims []string) bool {
	uids := map[string]bool{}
	for _, p := range c.Pods {
		if p.Spec.NodeName == node && slices.Contains(victims, p.Namespace+"/"+p.Name) {
			uids[string(p.UID)] = true
		}
	}
	for _, claim := range c.ResourceClaims {
		a := claim.Status.Allocation
		if a == nil || len(claim.Status.ReservedFor) == 0 {
			continue
		}
		onNode := false
		for _, res := range a.Devices.Results {
			onNode = onNode || res.Pool == node
		}
		allVictims := true
		for _, ref := range claim.Status.ReservedFor {
			allVictims = allVictims && uids[string(ref.UID)]
		}
		if onNode && allVictims {
			return true
		}
	}
	return false
}

// knownAs returns the name of the known divergence a difference is, or "".
func knownAs(c *Case, d Diff, up, dl *Result) string {
	for _, k := range knownDivergences {
		if k.match(c, d, up, dl) {
			return k.name
		}
	}
	return ""
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// loadCases draws the cases (or reads SCHEDULER_ORACLE_REPLAY) and says how.
func loadCases(t *testing.T) ([]*Case, string) {
	if file := os.Getenv("SCHEDULER_ORACLE_REPLAY"); file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var batch struct {
			Cases []*Case `json:"cases"`
		}
		if err := json.Unmarshal(b, &batch); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		return batch.Cases, "SCHEDULER_ORACLE_REPLAY=" + file
	}
	n := envInt("SCHEDULER_ORACLE_CASES", 1000)
	seed := int64(defaultSeed)
	if v := os.Getenv("SCHEDULER_ORACLE_SEED"); v == "random" {
		seed = time.Now().UnixNano() % 1_000_000_000
	} else if v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("SCHEDULER_ORACLE_SEED=%q", v)
		}
		seed = s
	}
	cases := make([]*Case, n)
	for i := range cases {
		s := seed + int64(i)
		cases[i] = genCase(rand.New(rand.NewSource(s)), fmt.Sprintf("seed-%d", s))
	}
	return cases, fmt.Sprintf("SCHEDULER_ORACLE_SEED=%d SCHEDULER_ORACLE_CASES=%d", seed, n)
}

// workDir is where failing cases are written ($TMPDIR/scheduler-oracle-*).
func workDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "scheduler-oracle-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if os.Getenv("SCHEDULER_ORACLE_KEEP") == "" && !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("work directory kept: %s", dir)
		}
	})
	return dir
}

func TestScheduler(t *testing.T) {
	if os.Getenv("SCHEDULER_ORACLE_UPSTREAM_ONLY") != "" {
		t.Skip("SCHEDULER_ORACLE_UPSTREAM_ONLY is set")
	}
	bin := os.Getenv("DEVICELET_BIN")
	if bin == "" {
		t.Skip("DEVICELET_BIN is not set")
	}
	cases, how := loadCases(t)
	t.Logf("%s", how)
	work := workDir(t)

	start := time.Now()
	var dl []Result
	var dlErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		dl, dlErr = runDevicelet(bin, filepath.Join(work, "batch"), cases)
	}()
	up := make([]Result, len(cases))
	for i, c := range cases {
		up[i] = runUpstream(c)
	}
	upTime := time.Since(start)
	<-done
	t.Logf("upstream %v, both sides %v", upTime.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if dlErr != nil {
		t.Fatal(dlErr)
	}
	t.Logf("upstream outcomes: %s", formatCounts(outcomeStats(up)))

	rep := evaluate(cases, up, dl)
	t.Logf("%s", rep.summary())
	if len(rep.differing) > 0 {
		// Every difference, one line each, for grep.
		var all strings.Builder
		for _, i := range rep.differing {
			for _, d := range rep.diffs[i] {
				fmt.Fprintf(&all, "%s\t%s\n", cases[i].Name, d)
			}
		}
		file := filepath.Join(work, "differences.txt")
		if err := os.WriteFile(file, []byte(all.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("all differences: %s", file)
	}
	show := envInt("SCHEDULER_ORACLE_SHOW", 5)
	for shown, i := range rep.differing {
		if shown >= show {
			break
		}
		c := cases[i]
		dir := saveCase(t, work, c, &up[i], &dl[i])
		t.Errorf("case %s differs (%s):\n  %s\n  files: %s (replay: $DEVICELET_BIN schedule -f %s -o json)",
			c.Name, describe(c), strings.Join(limit(diffStrings(rep.diffs[i]), 12), "\n  "), dir, filepath.Join(dir, "case.json"))
	}
	// A minimal reproducer for each kind of difference (the first case that has it), up to
	// SCHEDULER_ORACLE_SHRINK kinds (default 10; 0 turns shrinking off).
	maxShrink := envInt("SCHEDULER_ORACLE_SHRINK", 10)
	shrunk := map[string]bool{}
	for _, i := range rep.differing {
		for _, d := range rep.diffs[i] {
			if len(shrunk) >= maxShrink || shrunk[d.Kind] {
				continue
			}
			shrunk[d.Kind] = true
			c := cases[i]
			m := shrink(bin, filepath.Join(work, "shrink", c.Name, d.Kind), c, d.Kind)
			mu := runUpstream(m)
			md, err := runDevicelet(bin, filepath.Join(work, "shrink", c.Name, d.Kind, "final"), []*Case{m})
			if err != nil {
				t.Logf("shrinking %s: %v", c.Name, err)
				continue
			}
			mdir := saveCase(t, filepath.Join(work, "minimal", strings.ReplaceAll(d.Kind, " ", "-")), m, &mu, &md[0])
			t.Logf("minimal reproducer for %q, from %s: %s\n    %s\n    files: %s", d.Kind, c.Name, describe(m),
				strings.Join(limit(diffStrings(compare(m, &mu, &md[0])), 6), "\n    "), mdir)
		}
	}
	if len(rep.differing) > 0 {
		t.Errorf("%d of %d cases differ (%s)", len(rep.differing), len(cases), how)
	}
}

// report is the outcome of comparing all cases.
type report struct {
	cases     int
	differing []int          // indices of cases with unexplained differences
	diffs     map[int][]Diff // their unexplained differences
	kinds     map[string]int // kind -> cases with an unexplained difference of that kind
	known     map[string]int // known divergence -> cases
}

// evaluate compares every case and sorts the differences into unexplained and known.
func evaluate(cases []*Case, up, dl []Result) *report {
	rep := &report{cases: len(cases), diffs: map[int][]Diff{}, kinds: map[string]int{}, known: map[string]int{}}
	for i, c := range cases {
		kinds := map[string]bool{}
		knowns := map[string]bool{}
		var unexplained []Diff
		for _, d := range compare(c, &up[i], &dl[i]) {
			if k := knownAs(c, d, &up[i], &dl[i]); k != "" {
				knowns[k] = true
				continue
			}
			unexplained = append(unexplained, d)
			kinds[d.Kind] = true
		}
		for k := range knowns {
			rep.known[k]++
		}
		if len(unexplained) == 0 {
			continue
		}
		rep.differing = append(rep.differing, i)
		rep.diffs[i] = unexplained
		for k := range kinds {
			rep.kinds[k]++
		}
	}
	return rep
}

func (r *report) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d cases, %d with unexplained differences", r.cases, len(r.differing))
	if len(r.kinds) > 0 {
		fmt.Fprintf(&b, "; cases by kind of difference: %s", formatCounts(r.kinds))
	}
	if len(r.known) > 0 {
		fmt.Fprintf(&b, "; known divergences (cases): %s", formatCounts(r.known))
	}
	return b.String()
}

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func diffStrings(ds []Diff) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	return out
}

func limit(xs []string, n int) []string {
	if len(xs) <= n {
		return xs
	}
	return append(xs[:n:n], fmt.Sprintf("... and %d more", len(xs)-n))
}

// compare lists the differences between the two answers to one case. Reasons that differ only
// in their order are a kind of their own ("reasons order": NodeResourcesFit gives its reasons
// in a fixed resource order, pods, cpu, memory, ephemeral-storage, then extended resources);
// victims are compared as sets; a score missing on one side counts as 0.
func compare(c *Case, up, dl *Result) []Diff {
	var out []Diff
	add := func(kind, node, format string, args ...any) {
		out = append(out, Diff{Kind: kind, Node: node, Detail: fmt.Sprintf(format, args...)})
	}
	if (up.Error == "") != (dl.Error == "") {
		add("error", "", "upstream %q, devicelet %q", up.Error, dl.Error)
		return out
	}
	if up.Error != "" {
		return out // both refused the case
	}
	if !sameStatus(up.PreFilter, dl.PreFilter) {
		add("prefilter", "", "upstream %s, devicelet %s", fmtStatus(up.PreFilter), fmtStatus(dl.PreFilter))
	}

	// Nodes. When both PreFilters rejected the pod, devicelet may leave the nodes out.
	if !(up.PreFilter != nil && dl.PreFilter != nil && len(dl.Nodes) == 0) {
		dlNodes := map[string]*NodeResult{}
		for i := range dl.Nodes {
			dlNodes[dl.Nodes[i].Name] = &dl.Nodes[i]
		}
		for i := range up.Nodes {
			u := &up.Nodes[i]
			d, ok := dlNodes[u.Name]
			if !ok {
				add("node missing", u.Name, "devicelet did not answer for the node")
				continue
			}
			delete(dlNodes, u.Name)
			out = append(out, compareNode(u, d)...)
		}
		for name := range dlNodes {
			add("node extra", name, "devicelet answered for a node the case does not have")
		}
	}

	// Preemption.
	switch {
	case (up.Preemption == nil) != (dl.Preemption == nil):
		add("preemption", "", "upstream %s, devicelet %s", fmtPreemption(up.Preemption), fmtPreemption(dl.Preemption))
	case up.Preemption != nil:
		names := map[string]bool{}
		for n := range up.Preemption.Nodes {
			names[n] = true
		}
		for n := range dl.Preemption.Nodes {
			names[n] = true
		}
		for _, n := range sortedKeys(names) {
			u, uok := up.Preemption.Nodes[n]
			d, dok := dl.Preemption.Nodes[n]
			switch {
			case !uok || !dok:
				add("preemption nodes", n, "upstream dry-runs it: %v, devicelet: %v", uok, dok)
			case (u.Failure == "") != (d.Failure == ""):
				add("preemption outcome", n, "upstream %s, devicelet %s", fmtPreemptionNode(u), fmtPreemptionNode(d))
			case u.Failure != "":
				// The message is the reasons joined with ", ".
				ur, dr := strings.Split(u.Failure, ", "), strings.Split(d.Failure, ", ")
				switch {
				case !sameSorted(ur, dr):
					add("preemption failure text", n, "upstream %q, devicelet %q", u.Failure, d.Failure)
				case u.Failure != d.Failure:
					add("reasons order", n, "preemption failure: upstream %q, devicelet %q", u.Failure, d.Failure)
				}
			default:
				if !sameSet(u.Victims, d.Victims) {
					add("victims", n, "upstream %v, devicelet %v", u.Victims, d.Victims)
				} else if u.PDBViolations != d.PDBViolations {
					add("pdbViolations", n, "upstream %d, devicelet %d (victims %v)", u.PDBViolations, d.PDBViolations, u.Victims)
				}
			}
		}
	}
	return out
}

func compareNode(u, d *NodeResult) []Diff {
	var out []Diff
	add := func(kind, format string, args ...any) {
		out = append(out, Diff{Kind: kind, Node: u.Name, Detail: fmt.Sprintf(format, args...)})
	}
	switch {
	case (u.Rejection == nil) != (d.Rejection == nil):
		add("feasibility", "upstream %s, devicelet %s", fmtStatus(u.Rejection), fmtStatus(d.Rejection))
	case u.Rejection != nil:
		switch {
		case u.Rejection.Plugin != d.Rejection.Plugin:
			add("filter plugin", "upstream %s, devicelet %s", fmtStatus(u.Rejection), fmtStatus(d.Rejection))
		case u.Rejection.Code != d.Rejection.Code:
			add("filter code", "upstream %s, devicelet %s", fmtStatus(u.Rejection), fmtStatus(d.Rejection))
		case !sameSorted(u.Rejection.Reasons, d.Rejection.Reasons):
			add("reasons", "upstream %s, devicelet %s", fmtStatus(u.Rejection), fmtStatus(d.Rejection))
		case !slices.Equal(u.Rejection.Reasons, d.Rejection.Reasons):
			add("reasons order", "upstream %s, devicelet %s", fmtStatus(u.Rejection), fmtStatus(d.Rejection))
		}
	default:
		plugins := map[string]bool{}
		for p := range u.Scores {
			plugins[p] = true
		}
		for p := range d.Scores {
			plugins[p] = true
		}
		scoresEqual := true
		for _, p := range sortedKeys(plugins) {
			if u.Scores[p] != d.Scores[p] {
				scoresEqual = false
				add("score "+p, "upstream %d, devicelet %d", u.Scores[p], d.Scores[p])
			}
		}
		if scoresEqual && u.Total != d.Total {
			add("total", "upstream %d, devicelet %d (scores %v)", u.Total, d.Total, d.Scores)
		}
	}
	return out
}

func sameStatus(a, b *Status) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Plugin == b.Plugin && a.Code == b.Code && sameSorted(a.Reasons, b.Reasons)
}

func sameSorted(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// sameSet compares victim lists as sets (a victim listed twice is a difference too).
func sameSet(a, b []string) bool { return sameSorted(a, b) }

func fmtStatus(s *Status) string {
	if s == nil {
		return "feasible"
	}
	return fmt.Sprintf("%s/%s %q", s.Plugin, s.Code, s.Reasons)
}

func fmtPreemption(p *Preemption) string {
	if p == nil {
		return "no preemption"
	}
	b, _ := json.Marshal(p.Nodes)
	return string(b)
}

func fmtPreemptionNode(p PreemptionNode) string {
	if p.Failure != "" {
		return fmt.Sprintf("failure %q", p.Failure)
	}
	return fmt.Sprintf("victims %v (pdbViolations %d)", p.Victims, p.PDBViolations)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// runDevicelet answers the cases with one `devicelet schedule` run.
func runDevicelet(bin, dir string, cases []*Case) ([]Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	file := filepath.Join(dir, "cases.json")
	b, err := json.Marshal(map[string]any{"cases": cases})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "schedule", "-f", file, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("devicelet schedule -f %s: %v\n%s", file, err, tail(stderr.String(), 4000))
	}
	var res struct {
		Cases []Result `json:"cases"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("devicelet schedule output: %v\n%s", err, tail(stdout.String(), 2000))
	}
	if len(res.Cases) != len(cases) {
		return nil, fmt.Errorf("devicelet answered %d cases for %d", len(res.Cases), len(cases))
	}
	for i := range cases {
		if res.Cases[i].Name != cases[i].Name {
			return nil, fmt.Errorf("devicelet's answer %d is for %q, not %q", i, res.Cases[i].Name, cases[i].Name)
		}
	}
	return res.Cases, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// saveCase writes a case where it can be replayed: case.json (`devicelet schedule -f`, or
// SCHEDULER_ORACLE_REPLAY), and both answers.
func saveCase(t *testing.T, work string, c *Case, up, dl *Result) string {
	dir := filepath.Join(work, c.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, v any) {
		b, _ := json.MarshalIndent(v, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("case.json", map[string]any{"cases": []*Case{c}})
	write("upstream.json", up)
	write("devicelet.json", dl)
	return dir
}

// describe is a one-line summary of a case.
func describe(c *Case) string {
	cfg := "default config"
	if len(c.Config) > 0 {
		cfg = "custom config"
	}
	p := c.Pod.Spec
	var parts []string
	if p.Affinity != nil {
		if p.Affinity.NodeAffinity != nil {
			parts = append(parts, "node affinity")
		}
		if p.Affinity.PodAffinity != nil {
			parts = append(parts, "pod affinity")
		}
		if p.Affinity.PodAntiAffinity != nil {
			parts = append(parts, "pod anti-affinity")
		}
	}
	if len(p.TopologySpreadConstraints) > 0 {
		parts = append(parts, fmt.Sprintf("%d spread constraints", len(p.TopologySpreadConstraints)))
	}
	if len(c.Pod.OwnerReferences) > 0 {
		parts = append(parts, "owned by a "+c.Pod.OwnerReferences[0].Kind)
	}
	if len(p.Tolerations) > 0 {
		parts = append(parts, fmt.Sprintf("%d tolerations", len(p.Tolerations)))
	}
	if len(p.NodeSelector) > 0 {
		parts = append(parts, "nodeSelector")
	}
	if len(p.ResourceClaims) > 0 {
		parts = append(parts, fmt.Sprintf("%d DRA claims (%d slices, %d claims in all)", len(p.ResourceClaims), len(c.ResourceSlices), len(c.ResourceClaims)))
	}
	return fmt.Sprintf("%d nodes, %d pods, %d PDBs, %s; pod priority %d: %s", len(c.Nodes), len(c.Pods), len(c.PDBs), cfg,
		*p.Priority, strings.Join(parts, ", "))
}

// outcomeStats counts what the cases exercised upstream, so a run that tests little shows it.
func outcomeStats(results []Result) map[string]int {
	stats := map[string]int{}
	for _, res := range results {
		if res.Error != "" {
			stats["error"]++
			continue
		}
		if res.PreFilter != nil {
			stats["prefilter "+res.PreFilter.Plugin]++
		}
		feasible := 0
		for _, n := range res.Nodes {
			if n.Rejection != nil {
				plugin := n.Rejection.Plugin
				if plugin == "" {
					plugin = "(PreFilterResult)"
				}
				stats["rejected by "+plugin]++
				continue
			}
			feasible++
			for p, s := range n.Scores {
				if s != 0 {
					stats["scored by "+p]++
				}
			}
		}
		if feasible == 0 {
			stats["cases with no feasible node"]++
		}
		if res.Preemption != nil {
			stats["cases with a preemption dry run"]++
			for _, pn := range res.Preemption.Nodes {
				switch {
				case pn.Failure != "":
					stats["preemption: node fails"]++
				case pn.PDBViolations > 0:
					stats["preemption: victims violating a PDB"]++
				default:
					stats["preemption: victims"]++
				}
			}
		}
	}
	return stats
}

// deepCopyResults copies answers through JSON, as they would come back from devicelet.
func deepCopyResults(rs []Result) []Result {
	b, err := json.Marshal(rs)
	if err != nil {
		panic(err)
	}
	var out []Result
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}
