package workloads

import (
	"context"
	"testing"

	"devicelet.invalid/interop/allocator/harness"
)

// TestSmallWorkloadsFitAsDesigned runs scaled-down versions of every workload shape through the
// Go allocator after a JSON round trip and checks the designed fit counts.
func TestSmallWorkloadsFitAsDesigned(t *testing.T) {
	for _, tc := range []struct {
		w    Workload
		want int
	}{
		{SteadyState(5, 10, 0), 5},
		{SteadyState(5, 10, 500), 5},
		{SteadyState(5, 10, 980), 1}, // 49 of 50 allocated: only node-4's instance-9 is free
		{FillUpPods(60, 5, 10), 50},
		{Partitionable(3, 4), 3},
		{CELHeavy(5, 10), 5},
		{Backtracking(5), 1},
		{Backtracking(7), 1},
		{Backtracking(8), 0},
		{Consumable(3, 200), 3},
	} {
		data, err := harness.MarshalScenarioCompact(tc.w.Scenario)
		if err != nil {
			t.Fatal(err)
		}
		s, err := harness.ParseScenario(data)
		if err != nil {
			t.Fatalf("%s: %v", tc.w.Name, err)
		}
		p, err := harness.Prepare(s)
		if err != nil {
			t.Fatalf("%s: %v", tc.w.Name, err)
		}
		var got int
		if tc.w.Kind == FillUp {
			got, err = p.FillUp(context.Background())
		} else {
			got, err = p.SchedulePodAllNodes(context.Background())
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.w.Name, err)
		}
		if got != tc.want {
			t.Errorf("%s: fit %d, want %d", tc.w.Name, got, tc.want)
		}
	}
}
