package harness

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestErrorPrefixCutsLibraryAndListerTails(t *testing.T) {
	for in, want := range map[string]string{
		"claim c: selector #0: CEL compile error: compilation failed: ERROR: <input>:1:1: x": "claim c: selector #0: CEL compile error:",
		"class a: selector #1: CEL runtime error: no such key: model":                        "class a: selector #1: CEL runtime error:",
		`claim c, request r: could not retrieve device class x: deviceclass "x" not found`:   "claim c, request r: could not retrieve device class x",
		"claim c: number of requested devices 33 exceeds the claim limit of 32":              "claim c: number of requested devices 33 exceeds the claim limit of 32",
		"invalid resource pools were encountered":                                            "invalid resource pools were encountered",
	} {
		if got := ErrorPrefix(in); got != want {
			t.Errorf("ErrorPrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

func decode(t *testing.T, s string) any {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestNormaliseResultsAppliesShareIDQuantityAndEmptyRules(t *testing.T) {
	a := decode(t, `[{"devices":{"results":[
		{"request":"r","driver":"d","pool":"p","device":"x","shareID":"7a9c0000-0000-4000-8000-000000000000","consumedCapacity":{"memory":"1024Mi"}},
		{"request":"r","driver":"d","pool":"p","device":"y","tolerations":[]}],"config":[]},
		"allocationTimestamp":"2026-01-01T00:00:00Z"}]`)
	b := decode(t, `[{"devices":{"results":[
		{"request":"r","driver":"d","pool":"p","device":"x","shareID":"ffff","consumedCapacity":{"memory":"1Gi"}},
		{"request":"r","driver":"d","pool":"p","device":"y"}]}}]`)
	if d := DiffValues("results", NormaliseResults(a), NormaliseResults(b), 10); len(d) != 0 {
		t.Fatalf("equivalent results differ: %v", d)
	}
	c := decode(t, `[{"devices":{"results":[
		{"request":"r","driver":"d","pool":"p","device":"y"},
		{"request":"r","driver":"d","pool":"p","device":"x","shareID":"ffff","consumedCapacity":{"memory":"1Gi"}}]}}]`)
	if d := DiffValues("results", NormaliseResults(b), NormaliseResults(c), 10); len(d) == 0 {
		t.Fatal("results in a different order compare equal; order must be significant")
	}
	e := decode(t, `[{"devices":{"results":[
		{"request":"r","driver":"d","pool":"p","device":"x","shareID":"ffff","consumedCapacity":{"memory":"2Gi"}},
		{"request":"r","driver":"d","pool":"p","device":"y"}]}}]`)
	if d := DiffValues("results", NormaliseResults(b), NormaliseResults(e), 10); len(d) != 1 {
		t.Fatalf("a different consumed capacity must give exactly one difference, got %v", d)
	}
}

func TestCompareOutcomesReportsOutcomeAndErrorDifferences(t *testing.T) {
	want := NormaliseOutcome(decode(t, `{"perNode":[{"node":"n","outcome":"Error","error":"claim c: selector #0: CEL compile error: tail A"}]}`))
	sameClass := NormaliseOutcome(decode(t, `{"perNode":[{"node":"n","outcome":"Error","error":"claim c: selector #0: CEL compile error: other tail"}]}`))
	if d := CompareOutcomes(want, sameClass, DiffOptions{}); len(d) != 0 {
		t.Fatalf("CEL tails must not be compared: %v", d)
	}
	other := NormaliseOutcome(decode(t, `{"perNode":[{"node":"n","outcome":"Unschedulable","error":""}]}`))
	if d := CompareOutcomes(want, other, DiffOptions{}); len(d) != 1 {
		t.Fatalf("outcome difference not reported once: %v", d)
	}
	s1 := NormaliseOutcome(decode(t, `{"perNode":[{"node":"n","outcome":"Unschedulable","stats":{"allocateOneInvocations":3}}]}`))
	s2 := NormaliseOutcome(decode(t, `{"perNode":[{"node":"n","outcome":"Unschedulable","stats":{"allocateOneInvocations":4}}]}`))
	if d := CompareOutcomes(s1, s2, DiffOptions{}); len(d) != 0 {
		t.Fatalf("stats are informational by default: %v", d)
	}
	if d := CompareOutcomes(s1, s2, DiffOptions{Stats: true}); len(d) != 1 {
		t.Fatalf("stats difference not reported with Stats: %v", d)
	}
}

func TestParseScenarioDefaultsAndRejectsOldAPIVersions(t *testing.T) {
	s, err := ParseScenario([]byte(`
apiVersion: dra-harness/v1alpha1
kind: AllocationScenario
nodes: [{metadata: {name: node-1}}]
claims:
- metadata: {name: claim-1}
  spec: {devices: {requests: [{name: req-0, exactly: {deviceClassName: class-1, tolerations: [{key: taint-a}]}}]}}
resourceSlices:
- apiVersion: resource.k8s.io/v1beta2
  metadata: {name: slice-1}
  spec: {driver: driver.example.com, nodeName: node-1, pool: {name: pool-1, resourceSliceCount: 1}, devices: [{name: dev-x, bindingConditions: []}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := s.Claims[0].Spec.Devices.Requests[0].Exactly
	if r.AllocationMode != "ExactCount" || r.Count != 1 || r.Tolerations[0].Operator != "Equal" {
		t.Fatalf("API defaults not applied: %+v", r)
	}
	if s.ResourceSlices[0].Spec.Devices[0].BindingConditions != nil {
		t.Fatal("an empty bindingConditions list must be read as absent")
	}
	if s.Mode != "allocate" {
		t.Fatalf("mode = %q", s.Mode)
	}
	if _, err := ParseScenario([]byte(`{"resourceSlices":[{"apiVersion":"resource.k8s.io/v1beta1"}]}`)); err == nil {
		t.Fatal("resource.k8s.io/v1beta1 must be rejected")
	}
}

func TestRawResultsKeepEmptyFieldsThatNormalisationPrunes(t *testing.T) {
	goOut := NormaliseOutcome(decode(t, `{"perNode":[{"node":"n","outcome":"Allocated","results":[{"devices":{"results":[
		{"request":"r","driver":"d","pool":"p","device":"x","shareID":"7a9c0000-0000-4000-8000-000000000000","tolerations":[{"operator":"Exists"}]}]}}]}]}`))
	printed := NormaliseOutcome(decode(t, `{"perNode":[{"node":"n","outcome":"Allocated","results":[{"devices":{"results":[
		{"request":"r","driver":"d","pool":"p","device":"x","shareID":"ffff","tolerations":[{"operator":"Exists"}],"bindingConditions":[]}]}}]}]}`))
	if d := CompareOutcomes(goOut, printed, DiffOptions{}); len(d) != 0 {
		t.Fatalf("normalised results must treat [] as absent: %v", d)
	}
	d := CompareOutcomes(goOut, printed, DiffOptions{Raw: true})
	if len(d) != 1 || !strings.Contains(d[0], "results(raw)") || !strings.Contains(d[0], "bindingConditions") {
		t.Fatalf("raw comparison must report the printed empty list (and nothing else, shareIDs aside), got %v", d)
	}
	if d := CompareOutcomes(goOut, goOut, DiffOptions{Raw: true}); len(d) != 0 {
		t.Fatalf("an outcome differs from itself: %v", d)
	}
}
