// This file: the normalisation and comparison rules of spec §5.4 and the corpus README
// ("How a test runner should compare"), on the generic JSON form of an AllocationOutcome so that
// outcomes printed by another engine (devicelet) can be compared with the Go ones.
package harness

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// ToGeneric converts any JSON-marshalable value into its generic JSON form.
func ToGeneric(v any) (any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var g any
	if err := json.Unmarshal(data, &g); err != nil {
		return nil, err
	}
	return g, nil
}

// Prune removes nulls, empty lists, empty objects and allocationTimestamp, recursively
// (absent == null == empty, §5.4 rule 5).
func Prune(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range t {
			if k == "allocationTimestamp" {
				continue
			}
			p := Prune(e)
			if isEmpty(p) {
				continue
			}
			out[k] = p
		}
		return out
	case []any:
		out := make([]any, 0, len(t))
		for _, e := range t {
			out = append(out, Prune(e))
		}
		return out
	default:
		return v
	}
}

func isEmpty(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case map[string]any:
		return len(t) == 0
	case []any:
		return len(t) == 0
	}
	return false
}

// NormaliseResults applies §5.4 to a generic `results` list (one AllocationResult per claim):
// prune, replace shareIDs by share-<claimIndex>-<resultIndex>, canonicalise consumedCapacity
// quantities.
func NormaliseResults(results any) any {
	p := Prune(results)
	claims, ok := p.([]any)
	if !ok {
		if p == nil || isEmpty(p) {
			return []any{}
		}
		return p
	}
	for ci, c := range claims {
		cm, _ := c.(map[string]any)
		devices, _ := cm["devices"].(map[string]any)
		list, _ := devices["results"].([]any)
		for ri, r := range list {
			rm, ok := r.(map[string]any)
			if !ok {
				continue
			}
			if _, has := rm["shareID"]; has {
				rm["shareID"] = fmt.Sprintf("share-%d-%d", ci, ri)
			}
			if cc, ok := rm["consumedCapacity"].(map[string]any); ok {
				for k, q := range cc {
					if s, ok := q.(string); ok {
						cc[k] = CanonicalQuantity(s)
					}
				}
			}
		}
	}
	return claims
}

// RawResults is a generic `results` list exactly as printed, except for the values of the
// shareIDs (random UUIDs in Go), which become share-<claimIndex>-<resultIndex> where present.
// Nothing is pruned: a field Go omits (omitempty) and one printed as "" or [] differ here, and
// so do two spellings of one quantity. The input is not modified.
func RawResults(results any) any {
	c, err := ToGeneric(results)
	if err != nil {
		return results
	}
	claims, _ := c.([]any)
	for ci, cl := range claims {
		cm, _ := cl.(map[string]any)
		devices, _ := cm["devices"].(map[string]any)
		list, _ := devices["results"].([]any)
		for ri, r := range list {
			if rm, ok := r.(map[string]any); ok {
				if _, has := rm["shareID"]; has {
					rm["shareID"] = fmt.Sprintf("share-%d-%d", ci, ri)
				}
			}
		}
	}
	return c
}

// CanonicalQuantity re-emits a quantity in Kubernetes canonical form; unparsable input is kept
// (with a marker) so that it compares unequal to any valid quantity.
func CanonicalQuantity(s string) string {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return "unparsable:" + s
	}
	return q.String()
}

// ErrorPrefix returns the part of an error text that the allocator itself produces: everything up
// to and including "CEL compile error:" / "CEL runtime error:", or up to the class name after
// "could not retrieve device class NAME" (§5.4 rule 4, corpus README rule 3).
func ErrorPrefix(msg string) string {
	cut := len(msg)
	for _, marker := range []string{"CEL compile error:", "CEL runtime error:"} {
		if i := strings.Index(msg, marker); i >= 0 && i+len(marker) < cut {
			cut = i + len(marker)
		}
	}
	const lister = "could not retrieve device class "
	if i := strings.Index(msg, lister); i >= 0 {
		end := i + len(lister)
		if j := strings.Index(msg[end:], ":"); j >= 0 {
			end += j
		} else {
			end = len(msg)
		}
		if end < cut {
			cut = end
		}
	}
	return msg[:cut]
}

// NormNode is the comparable part of one per-node outcome.
type NormNode struct {
	Node        string `json:"node"`
	Outcome     string `json:"outcome"`
	ErrorPrefix string `json:"errorPrefix,omitempty"`
	Results     any    `json:"results,omitempty"`
	// Raw is `results` as printed, see RawResults (compared with DiffOptions.Raw).
	Raw any `json:"-"`
	// Stats is informational (not part of Equal unless asked for).
	AllocateOneInvocations *float64 `json:"-"`
}

// NormPod is the comparable part of one pod of mode: schedule.
type NormPod struct {
	Pod         string     `json:"pod"`
	Node        string     `json:"node,omitempty"`
	Outcome     string     `json:"outcome"`
	ErrorPrefix string     `json:"errorPrefix,omitempty"`
	Results     any        `json:"results,omitempty"`
	Raw         any        `json:"-"`
	PerNode     []NormNode `json:"perNode,omitempty"`
}

// NormOutcome is the comparable part of an AllocationOutcome.
type NormOutcome struct {
	PerNode []NormNode `json:"perNode"`
	Pods    []NormPod  `json:"pods,omitempty"`
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

func normNode(v any) NormNode {
	m, _ := v.(map[string]any)
	n := NormNode{Node: str(m, "node"), Outcome: str(m, "outcome"), ErrorPrefix: ErrorPrefix(str(m, "error"))}
	if n.Outcome == OutcomeAllocated {
		n.Results = NormaliseResults(m["results"])
		n.Raw = RawResults(m["results"])
	}
	if st, ok := m["stats"].(map[string]any); ok {
		if f, ok := st["allocateOneInvocations"].(float64); ok {
			n.AllocateOneInvocations = &f
		}
	}
	return n
}

// NormaliseOutcome turns a generic AllocationOutcome (as decoded from JSON) into its comparable form.
func NormaliseOutcome(v any) NormOutcome {
	m, _ := v.(map[string]any)
	var o NormOutcome
	list, _ := m["perNode"].([]any)
	o.PerNode = []NormNode{}
	for _, e := range list {
		o.PerNode = append(o.PerNode, normNode(e))
	}
	pods, _ := m["pods"].([]any)
	for _, e := range pods {
		pm, _ := e.(map[string]any)
		p := NormPod{Pod: str(pm, "pod"), Node: str(pm, "node"), Outcome: str(pm, "outcome"), ErrorPrefix: ErrorPrefix(str(pm, "error"))}
		if p.Outcome == OutcomeAllocated {
			p.Results = NormaliseResults(pm["results"])
			p.Raw = RawResults(pm["results"])
		}
		pn, _ := pm["perNode"].([]any)
		for _, n := range pn {
			p.PerNode = append(p.PerNode, normNode(n))
		}
		o.Pods = append(o.Pods, p)
	}
	return o
}

// DiffOptions tunes CompareOutcomes.
type DiffOptions struct {
	// Stats also compares allocateOneInvocations (informational by default, §5.2).
	Stats bool
	// MaxDiffs bounds the number of reported differences (default 20).
	MaxDiffs int
	// Raw also compares the results as printed (RawResults) where the normalised results are
	// equal: fields Go omits must be absent, not "" or [] (issue 19 item 3).
	Raw bool
}

// CompareOutcomes compares two normalised outcomes strictly (order significant) and returns the
// differences as "path: a != b" lines; empty means equal.
func CompareOutcomes(want, got NormOutcome, opts DiffOptions) []string {
	if opts.MaxDiffs == 0 {
		opts.MaxDiffs = 20
	}
	var diffs []string
	add := func(format string, args ...any) {
		if len(diffs) < opts.MaxDiffs {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	cmpNodes := func(prefix string, a, b []NormNode) {
		if len(a) != len(b) {
			add("%sperNode: length %d != %d", prefix, len(a), len(b))
		}
		for i := 0; i < len(a) && i < len(b); i++ {
			p := fmt.Sprintf("%sperNode[%d]", prefix, i)
			cmpNode(p, a[i], b[i], opts, add)
		}
	}
	cmpNodes("", want.PerNode, got.PerNode)
	if len(want.Pods) != len(got.Pods) {
		add("pods: length %d != %d", len(want.Pods), len(got.Pods))
	}
	for i := 0; i < len(want.Pods) && i < len(got.Pods); i++ {
		a, b := want.Pods[i], got.Pods[i]
		p := fmt.Sprintf("pods[%d](%s)", i, a.Pod)
		if a.Pod != b.Pod {
			add("%s.pod: %q != %q", p, a.Pod, b.Pod)
		}
		if a.Node != b.Node {
			add("%s.node: %q != %q", p, a.Node, b.Node)
		}
		if a.Outcome != b.Outcome {
			add("%s.outcome: %s != %s", p, a.Outcome, b.Outcome)
		}
		if a.ErrorPrefix != b.ErrorPrefix {
			add("%s.error: %q != %q", p, a.ErrorPrefix, b.ErrorPrefix)
		}
		d := DiffValues(p+".results", a.Results, b.Results, opts.MaxDiffs)
		if len(d) == 0 && opts.Raw {
			d = DiffValues(p+".results(raw)", a.Raw, b.Raw, opts.MaxDiffs)
		}
		for _, d := range d {
			add("%s", d)
		}
		cmpNodes(p+".", a.PerNode, b.PerNode)
	}
	return diffs
}

func cmpNode(p string, a, b NormNode, opts DiffOptions, add func(string, ...any)) {
	if a.Node != b.Node {
		add("%s.node: %q != %q", p, a.Node, b.Node)
	}
	if a.Outcome != b.Outcome {
		add("%s(%s).outcome: %s != %s (errors: %q / %q)", p, a.Node, a.Outcome, b.Outcome, a.ErrorPrefix, b.ErrorPrefix)
		return
	}
	if a.ErrorPrefix != b.ErrorPrefix {
		add("%s(%s).error: %q != %q", p, a.Node, a.ErrorPrefix, b.ErrorPrefix)
	}
	d := DiffValues(fmt.Sprintf("%s(%s).results", p, a.Node), a.Results, b.Results, 10)
	if len(d) == 0 && opts.Raw {
		d = DiffValues(fmt.Sprintf("%s(%s).results(raw)", p, a.Node), a.Raw, b.Raw, 10)
	}
	for _, d := range d {
		add("%s", d)
	}
	if opts.Stats && a.AllocateOneInvocations != nil && b.AllocateOneInvocations != nil && *a.AllocateOneInvocations != *b.AllocateOneInvocations {
		add("%s(%s).stats.allocateOneInvocations: %v != %v", p, a.Node, *a.AllocateOneInvocations, *b.AllocateOneInvocations)
	}
}

// DiffValues lists where two generic JSON values differ (at most max entries).
func DiffValues(path string, a, b any, max int) []string {
	var out []string
	var walk func(path string, a, b any)
	walk = func(path string, a, b any) {
		if len(out) >= max {
			return
		}
		switch at := a.(type) {
		case map[string]any:
			bt, ok := b.(map[string]any)
			if !ok {
				out = append(out, fmt.Sprintf("%s: %s != %s", path, compact(a), compact(b)))
				return
			}
			keys := map[string]bool{}
			for k := range at {
				keys[k] = true
			}
			for k := range bt {
				keys[k] = true
			}
			sorted := make([]string, 0, len(keys))
			for k := range keys {
				sorted = append(sorted, k)
			}
			sort.Strings(sorted)
			for _, k := range sorted {
				walk(path+"."+k, at[k], bt[k])
			}
		case []any:
			bt, ok := b.([]any)
			if !ok {
				out = append(out, fmt.Sprintf("%s: %s != %s", path, compact(a), compact(b)))
				return
			}
			if len(at) != len(bt) {
				out = append(out, fmt.Sprintf("%s: length %d != %d: %s != %s", path, len(at), len(bt), compact(a), compact(b)))
				return
			}
			for i := range at {
				walk(fmt.Sprintf("%s[%d]", path, i), at[i], bt[i])
			}
		default:
			if !reflect.DeepEqual(a, b) {
				out = append(out, fmt.Sprintf("%s: %s != %s", path, compact(a), compact(b)))
			}
		}
	}
	walk(path, a, b)
	return out
}

func compact(v any) string {
	if v == nil {
		return "<absent>"
	}
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(data) > 300 {
		return string(data[:300]) + "…"
	}
	return string(data)
}
