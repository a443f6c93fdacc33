// This file: checking an outcome against a corpus `expect` block
// (../shared/conformance/allocator/README.md, "How a test runner should compare").
package harness

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ExpectCheck tunes CheckExpect.
type ExpectCheck struct {
	// AllStats requires allocateOneInvocations to match on every case, not only where the corpus
	// sets checkStats (the Go oracle is expected to reproduce them everywhere).
	AllStats bool
}

// CheckExpect compares an outcome with a corpus `expect` block: outcome strictly, results strictly
// in order after normalisation, error text must start with errorPrefix, stats where required.
// It returns mismatches (failures) and warnings.
func CheckExpect(expect json.RawMessage, got *Outcome, opts ExpectCheck) (mismatches, warnings []string, err error) {
	var want map[string]any
	if err := json.Unmarshal(expect, &want); err != nil {
		return nil, nil, fmt.Errorf("decode expect: %w", err)
	}
	gotGeneric, err := ToGeneric(got)
	if err != nil {
		return nil, nil, err
	}
	checkStats, _ := want["checkStats"].(bool)
	wantNodes, _ := want["perNode"].([]any)
	gotNodes, _ := gotGeneric.(map[string]any)["perNode"].([]any)
	if len(wantNodes) != len(gotNodes) {
		mismatches = append(mismatches, fmt.Sprintf("perNode: length %d != %d", len(wantNodes), len(gotNodes)))
		return mismatches, nil, nil
	}
	for i := range wantNodes {
		w, _ := wantNodes[i].(map[string]any)
		g, _ := gotNodes[i].(map[string]any)
		p := fmt.Sprintf("perNode[%d](%s)", i, str(w, "node"))
		if str(w, "node") != str(g, "node") {
			mismatches = append(mismatches, fmt.Sprintf("%s.node: %q != %q", p, str(w, "node"), str(g, "node")))
		}
		if str(w, "outcome") != str(g, "outcome") {
			mismatches = append(mismatches, fmt.Sprintf("%s.outcome: want %s, got %s (error %q)", p, str(w, "outcome"), str(g, "outcome"), str(g, "error")))
			continue
		}
		prefix := str(w, "errorPrefix")
		if prefix == "" {
			prefix = str(w, "error")
		}
		if !strings.HasPrefix(str(g, "error"), prefix) {
			mismatches = append(mismatches, fmt.Sprintf("%s.error: %q does not start with %q", p, str(g, "error"), prefix))
		}
		if wc := str(w, "errorClass"); wc != "" && wc != str(g, "errorClass") {
			warnings = append(warnings, fmt.Sprintf("%s.errorClass: want %s, got %s", p, wc, str(g, "errorClass")))
		}
		if str(w, "error") != str(g, "error") {
			warnings = append(warnings, fmt.Sprintf("%s.error full text differs: %q vs %q", p, str(w, "error"), str(g, "error")))
		}
		if str(w, "outcome") == OutcomeAllocated {
			mismatches = append(mismatches, DiffValues(p+".results", NormaliseResults(w["results"]), NormaliseResults(g["results"]), 10)...)
		}
		ws, _ := w["stats"].(map[string]any)
		gs, _ := g["stats"].(map[string]any)
		if ws != nil {
			if wv, gv := ws["allocateOneInvocations"], gs["allocateOneInvocations"]; wv != gv {
				msg := fmt.Sprintf("%s.stats.allocateOneInvocations: want %v, got %v", p, wv, gv)
				if checkStats || opts.AllStats {
					mismatches = append(mismatches, msg)
				} else {
					warnings = append(warnings, msg)
				}
			}
		}
	}
	return mismatches, warnings, nil
}
