// Parity of devicelet-cel's compile step with Kubernetes' DRA CEL compiler.
//
// The Rust test crates/devicelet-cel/tests/type_check_parity.rs writes its corpus and
// verdicts to the file named by DEVICELET_CEL_PARITY_FILE (run.sh does both steps). Each
// expression is compiled here with k8s.io/dynamic-resource-allocation/cel and the
// verdicts must agree: accept versus reject exactly, and for rejections the kind of the
// first issue ("found no matching overload for", "expected type", "undeclared
// reference to", "must evaluate to bool", ...). Full-text agreement is reported.
package cel

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"devicelet.invalid/interop/cel/oracle"
)

type paritySet struct {
	Features oracle.Features  `json:"features"`
	Cases    []oracle.Verdict `json:"cases"`
}

type parityFile struct {
	Sets []paritySet `json:"sets"`
}

var positionRE = regexp.MustCompile(`^(compilation failed: )?ERROR: <input>:\d+:\d+: `)

// errorKind is the first issue's message with its position and quoted details removed.
func errorKind(text string) string {
	first := strings.SplitN(text, "\n", 2)[0]
	first = positionRE.ReplaceAllString(first, "")
	if i := strings.IndexAny(first, "'"); i >= 0 {
		first = first[:i]
	}
	if strings.HasPrefix(first, "program instantiation failed") {
		return "program instantiation failed"
	}
	if strings.HasPrefix(first, "must evaluate to bool") {
		return "must evaluate to bool"
	}
	return strings.TrimSpace(first)
}

func TestParity(t *testing.T) {
	path := os.Getenv("DEVICELET_CEL_PARITY_FILE")
	if path == "" {
		t.Skip("DEVICELET_CEL_PARITY_FILE not set (run interop/cel/run.sh)")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file parityFile
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Sets) == 0 {
		t.Fatal("no expression sets in the parity file")
	}
	for _, set := range file.Sets {
		name := fmt.Sprintf("consumableCapacity=%v,listTypeAttributes=%v", set.Features.ConsumableCapacity, set.Features.ListTypeAttributes)
		t.Run(name, func(t *testing.T) { compareSet(t, set) })
	}
}

// knownDivergences reads testdata/known-divergences.txt.
func knownDivergences(t *testing.T) map[string]bool {
	data, err := os.ReadFile("testdata/known-divergences.txt")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		known[line] = true
	}
	return known
}

func compareSet(t *testing.T, set paritySet) {
	if len(set.Cases) < 100 {
		t.Fatalf("corpus has only %d expressions", len(set.Cases))
	}
	known := knownDivergences(t)
	var verdictMismatch, kindMismatch, sameText, goPanics, knownCount int
	for _, ours := range set.Cases {
		want := oracle.Compile(ours.Expr, set.Features)
		if known[ours.Expr] {
			if want.Panic == "" && want.OK == ours.OK {
				t.Errorf("listed as a known divergence but now agrees (remove it from testdata/known-divergences.txt): %q", ours.Expr)
			} else {
				knownCount++
				t.Logf("known divergence %q: go ok=%v, devicelet ok=%v", ours.Expr, want.OK, ours.OK)
			}
			continue
		}
		switch {
		case want.Panic != "":
			// cel-go crashes on it; there is no Go verdict to compare with.
			goPanics++
			t.Logf("cel-go panics on %q: %s", ours.Expr, want.Panic)
		case want.OK != ours.OK:
			verdictMismatch++
			t.Errorf("verdict differs for %q:\n  go:        ok=%v %s\n  devicelet: ok=%v %s", ours.Expr, want.OK, want.Error, ours.OK, ours.Error)
		case !want.OK && errorKind(want.Error) != errorKind(ours.Error):
			kindMismatch++
			t.Errorf("error kind differs for %q:\n  go:        %s\n  devicelet: %s", ours.Expr, want.Error, ours.Error)
		case want.Error == ours.Error:
			sameText++
		}
	}
	t.Logf("%d expressions: %d verdict mismatches, %d error-kind mismatches, %d identical error texts or both accepted, %d known divergences, %d cel-go panics (skipped)",
		len(set.Cases), verdictMismatch, kindMismatch, sameText, knownCount, goPanics)
}

func TestErrorKind(t *testing.T) {
	cases := map[string]string{
		"compilation failed: ERROR: <input>:1:15: found no matching overload for '_==_' applied to '(string, int)'\n | x": "found no matching overload for",
		"must evaluate to bool or the unknown type, not int":                                                              "must evaluate to bool",
		"compilation failed: ERROR: <input>:1:1: undeclared reference to 'x' (in container '')":                           "undeclared reference to",
	}
	for in, want := range cases {
		if got := errorKind(in); got != want {
			t.Errorf("errorKind(%q) = %q, want %q", in, got, want)
		}
	}
}
