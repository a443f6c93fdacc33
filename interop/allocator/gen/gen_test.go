package gen

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"devicelet.invalid/interop/allocator/harness"
)

func TestScenarioIsDeterministicPerSeed(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		a, err := harness.MarshalScenario(Scenario(seed, Config{}))
		if err != nil {
			t.Fatal(err)
		}
		b, err := harness.MarshalScenario(Scenario(seed, Config{}))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("seed %d: two generations differ", seed)
		}
	}
	a, _ := harness.MarshalScenario(Scenario(1, Config{}))
	b, _ := harness.MarshalScenario(Scenario(2, Config{}))
	if bytes.Equal(a, b) {
		t.Fatal("seeds 1 and 2 generate the same scenario")
	}
}

// TestGeneratedScenariosCoverTheFeatureSpace generates 400 scenarios, checks that each reads back
// through the scenario parser and that together they exercise every feature the differential
// test is meant to cover, and that the upstream allocator produces every kind of outcome on them.
func TestGeneratedScenariosCoverTheFeatureSpace(t *testing.T) {
	seen := map[string]int{}
	caches := harness.NewCELCaches()
	for seed := uint64(1); seed <= 400; seed++ {
		data, err := harness.MarshalScenarioCompact(Scenario(seed, Config{}))
		if err != nil {
			t.Fatal(err)
		}
		s, err := harness.ParseScenario(data)
		if err != nil {
			t.Fatalf("seed %d: generated scenario does not parse: %v", seed, err)
		}
		if len(s.Nodes) < 1 || len(s.Nodes) > 20 {
			t.Fatalf("seed %d: %d nodes", seed, len(s.Nodes))
		}
		text := string(data)
		for _, feature := range []string{
			`"consumesCounters"`, `"sharedCounters"`, `"taints"`, `"bindingConditions"`, `"bindsToNode"`,
			`"allowMultipleAllocations"`, `"requestPolicy"`, `"firstAvailable"`, `"allocationMode":"All"`,
			`"adminAccess":true`, `"matchAttribute"`, `"distinctAttribute"`, `"capacity":{"requests"`,
			`"tolerations"`, `"perDeviceNodeSelection"`, `"allNodes"`, `"nodeSelector"`, `"version"`,
			`"bool"`, `"int"`, `"string"`, `semver(`, `quantity(`, `.matches(`, `has(device`, ` in [`,
			`"sharedDevices"`, `"consumedCapacity"`, `"status":{"allocation"`, `"mode":"schedule"`,
			`"opaque"`, `"generation":1,"resourceSliceCount":3`,
		} {
			if strings.Contains(text, feature) {
				seen[feature]++
			}
		}
		out := harness.RunWith(context.Background(), s, harness.RunOptions{CELCaches: caches})
		for _, n := range out.PerNode {
			seen["outcome:"+n.Outcome]++
			if n.ErrorClass != "" {
				seen["class:"+n.ErrorClass]++
			}
		}
		for _, p := range out.Pods {
			seen["pod:"+p.Outcome]++
		}
	}
	for _, want := range []string{
		`"consumesCounters"`, `"sharedCounters"`, `"taints"`, `"bindingConditions"`, `"bindsToNode"`,
		`"allowMultipleAllocations"`, `"requestPolicy"`, `"firstAvailable"`, `"allocationMode":"All"`,
		`"adminAccess":true`, `"matchAttribute"`, `"distinctAttribute"`, `"capacity":{"requests"`,
		`"tolerations"`, `"perDeviceNodeSelection"`, `"allNodes"`, `"nodeSelector"`, `"version"`,
		`"bool"`, `"int"`, `"string"`, `semver(`, `quantity(`, `.matches(`, `has(device`, ` in [`,
		`"sharedDevices"`, `"consumedCapacity"`, `"status":{"allocation"`, `"mode":"schedule"`, `"opaque"`,
		"outcome:Allocated", "outcome:Unschedulable", "outcome:Error", "outcome:UnschedulableOnNode",
		"class:CELCompile", "class:CELRuntime", "class:AllModeIncompletePool", "class:UnknownClass",
		"pod:Allocated", "pod:Unschedulable",
	} {
		if seen[want] == 0 {
			t.Errorf("400 generated scenarios never contain %s", want)
		}
	}
	t.Logf("coverage: %v", seen)
}
