// Command gobench measures the upstream Go DRA structured allocator
// (k8s.io/dynamic-resource-allocation, incubating) on the scheduler_perf-shaped workloads of spec
// structured-allocator.md §4.4-§4.5 and prints one line per workload:
//
//	workload=<name> go_allocs_per_sec=<x> pods=<n> seconds=<s> fit=<k>
//
// "allocations" are pods: for per-pod workloads one unit is a new allocator plus one Allocate per
// node (PreFilter + Filter); for fill-up one unit is one pod placed on the first node that fits.
// With -write-dir each workload is also written as an AllocationScenario (<name>.json), and the
// measurement runs on the scenario read back from that JSON, so devicelet's Rust benchmark can run
// the identical input.
//
//	go run ./cmd/gobench [-duration 1s] [-run REGEXP] [-write-dir DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"devicelet.invalid/interop/allocator/harness"
	"devicelet.invalid/interop/allocator/workloads"
)

func main() {
	duration := flag.Duration("duration", time.Second, "measuring time per workload (at least one unit is run)")
	run := flag.String("run", "", "only workloads whose name matches this regular expression")
	writeDir := flag.String("write-dir", "", "write each workload as an AllocationScenario JSON file into this directory")
	writeOnly := flag.Bool("write-only", false, "only write the scenario files (needs -write-dir)")
	flag.Parse()
	var filter *regexp.Regexp
	if *run != "" {
		filter = regexp.MustCompile(*run)
	}
	if *writeDir != "" {
		if err := os.MkdirAll(*writeDir, 0o755); err != nil {
			fatal(err)
		}
	}
	ctx := context.Background()
	failed := false
	for _, w := range workloads.All() {
		if filter != nil && !filter.MatchString(w.Name) {
			continue
		}
		data, err := harness.MarshalScenarioCompact(w.Scenario)
		if err != nil {
			fatal(err)
		}
		if *writeDir != "" {
			path := filepath.Join(*writeDir, w.Name+".json")
			if err := os.WriteFile(path, data, 0o644); err != nil {
				fatal(err)
			}
			fmt.Fprintf(os.Stderr, "wrote %s\n", path)
		}
		if *writeOnly {
			continue
		}
		s, err := harness.ParseScenario(data)
		if err != nil {
			fatal(fmt.Errorf("%s: %w", w.Name, err))
		}
		p, err := harness.Prepare(s)
		if err != nil {
			fatal(fmt.Errorf("%s: %w", w.Name, err))
		}
		unit := func() (int, error) {
			if w.Kind == workloads.FillUp {
				return p.FillUp(ctx)
			}
			return p.SchedulePodAllNodes(ctx)
		}
		podsPerUnit := 1
		if w.Kind == workloads.FillUp {
			podsPerUnit = len(s.Pods)
		}
		// Warm-up (CEL compilation) and sanity check.
		fit, err := unit()
		if err != nil {
			fmt.Printf("workload=%s error=%q\n", w.Name, err.Error())
			failed = true
			continue
		}
		if (w.WantFit >= 0 && fit != w.WantFit) || (w.WantFit < 0 && fit == 0) {
			fmt.Printf("workload=%s error=%q\n", w.Name, fmt.Sprintf("sanity check: fit=%d, want %d", fit, w.WantFit))
			failed = true
			continue
		}
		units := 0
		start := time.Now()
		for units == 0 || time.Since(start) < *duration {
			if _, err := unit(); err != nil {
				fatal(err)
			}
			units++
		}
		secs := time.Since(start).Seconds()
		pods := units * podsPerUnit
		fmt.Printf("workload=%s go_allocs_per_sec=%.1f pods=%d seconds=%.3f fit=%d\n", w.Name, float64(pods)/secs, pods, secs, fit)
	}
	if failed {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "gobench:", err)
	os.Exit(1)
}
