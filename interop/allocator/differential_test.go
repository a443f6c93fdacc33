package allocatorinterop_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"devicelet.invalid/interop/allocator/gen"
	"devicelet.invalid/interop/allocator/harness"
)

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

// deviceletBinary returns $DEVICELET_BIN after checking that it has the `allocate` subcommand,
// and whether that subcommand offers the batch mode (`--batch DIR`, see runDeviceletBatch).
// When it is missing it skips (DEVICELET_INTEROP_OPTIONAL=1) or fails.
func deviceletBinary(t *testing.T) (string, bool) {
	optional := os.Getenv("DEVICELET_INTEROP_OPTIONAL") == "1"
	missing := func(format string, args ...any) (string, bool) {
		msg := fmt.Sprintf(format, args...)
		if optional {
			t.Skipf("TestDifferential skipped (DEVICELET_INTEROP_OPTIONAL=1): %s", msg)
		}
		t.Fatalf("TestDifferential needs devicelet: %s (set DEVICELET_INTEROP_OPTIONAL=1 to skip)", msg)
		return "", false
	}
	bin := os.Getenv("DEVICELET_BIN")
	if bin == "" {
		return missing("DEVICELET_BIN is not set")
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return missing("DEVICELET_BIN=%s is not an executable file", bin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "allocate", "--help").CombinedOutput()
	if err != nil {
		return missing("%s has no working `allocate` subcommand (`allocate --help`: %v: %s)", bin, err, firstLines(string(out), 5))
	}
	batch := strings.Contains(string(out), "--batch") && os.Getenv("DIFF_BATCH") != "0"
	return bin, batch
}

// runDeviceletBatch runs `devicelet allocate --batch DIR -o json`, which must print one
// AllocationOutcome per line (JSON lines) for every *.json scenario in DIR; outcomes are matched
// to scenarios by `name`.
func runDeviceletBatch(bin, dir string) (map[string]any, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "allocate", "--batch", dir, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	runErr := cmd.Run()
	d := time.Since(start)
	outcomes := map[string]any{}
	dec := json.NewDecoder(&stdout)
	for {
		var o map[string]any
		if err := dec.Decode(&o); err != nil {
			if err.Error() == "EOF" {
				break
			}
			return outcomes, d, fmt.Errorf("devicelet allocate --batch %s: bad output after %d outcomes (exit: %v): %v\nstderr: %s", dir, len(outcomes), runErr, err, firstLines(stderr.String(), 20))
		}
		name, _ := o["name"].(string)
		outcomes[name] = o
	}
	if runErr != nil && len(outcomes) == 0 {
		return outcomes, d, fmt.Errorf("devicelet allocate --batch %s: %v\nstderr: %s", dir, runErr, firstLines(stderr.String(), 20))
	}
	return outcomes, d, nil
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

// runDevicelet runs `devicelet allocate -f file -o json` and decodes the outcome.
func runDevicelet(bin, file string) (any, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "allocate", "-f", file, "-o", "json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	runErr := cmd.Run()
	d := time.Since(start)
	var out any
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, d, fmt.Errorf("devicelet allocate -f %s: no JSON outcome on stdout (exit: %v): %v\nstdout: %s\nstderr: %s",
			file, runErr, err, firstLines(stdout.String(), 10), firstLines(stderr.String(), 20))
	}
	if m, ok := out.(map[string]any); !ok || m["kind"] != "AllocationOutcome" {
		return nil, d, fmt.Errorf("devicelet allocate -f %s: output is not an AllocationOutcome (exit: %v): %s", file, runErr, firstLines(stdout.String(), 10))
	}
	return out, d, nil
}

// celCaches shares compiled selectors across the differential scenarios.
var celCaches = harness.NewCELCaches()

// oracle runs the upstream allocator on the scenario file, exactly as devicelet reads it.
func oracle(file string) (harness.NormOutcome, *harness.Outcome, error) {
	s, err := harness.ReadScenarioFile(file)
	if err != nil {
		return harness.NormOutcome{}, nil, err
	}
	out := harness.RunWith(context.Background(), s, harness.RunOptions{CELCaches: celCaches})
	g, err := harness.ToGeneric(out)
	if err != nil {
		return harness.NormOutcome{}, nil, err
	}
	return harness.NormaliseOutcome(g), out, nil
}

// compareFile runs both engines on one file; it returns the differences (nil = equal) and the
// stats differences separately.
// pre, if not nil, is devicelet's outcome from a batch run (then devicelet is not started here).
func compareFile(bin, file string, strictStats bool, pre any) (diffs, statDiffs []string, goOut *harness.Outcome, goTime, rsTime time.Duration, err error) {
	start := time.Now()
	want, goOut, err := oracle(file)
	goTime = time.Since(start)
	if err != nil {
		return nil, nil, nil, goTime, 0, fmt.Errorf("oracle: %w", err)
	}
	gotRaw := pre
	if gotRaw == nil {
		gotRaw, rsTime, err = runDevicelet(bin, file)
		if err != nil {
			return nil, nil, goOut, goTime, rsTime, err
		}
	}
	got := harness.NormaliseOutcome(gotRaw)
	raw := os.Getenv("DIFF_RAW") != "0"
	diffs = harness.CompareOutcomes(want, got, harness.DiffOptions{Stats: strictStats, Raw: raw})
	if !strictStats && len(diffs) == 0 {
		// Equal apart from stats? Then every difference with stats on is a stats difference.
		statDiffs = harness.CompareOutcomes(want, got, harness.DiffOptions{Stats: true, Raw: raw})
	}
	return diffs, statDiffs, goOut, goTime, rsTime, nil
}

func hasTimeout(o *harness.Outcome) bool {
	if o == nil {
		return false
	}
	nodes := o.PerNode
	for _, p := range o.Pods {
		nodes = append(nodes, p.PerNode...)
	}
	for _, n := range nodes {
		if n.Outcome == harness.OutcomeTimeout {
			return true
		}
	}
	return false
}

type diffFailure struct {
	seed  uint64
	file  string
	diffs []string
	err   error
}

// TestDifferential generates DIFF_N (default 2000) random scenarios (seeds DIFF_SEED.. , default
// 1), runs each through the upstream Go allocator in-process and through
// `$DEVICELET_BIN allocate -f FILE -o json`, normalises both per spec §5.4 and compares them
// strictly (outcome, error prefix, results in order). allocateOneInvocations differences are
// reported but only fail with DIFF_STATS=1. On a mismatch the scenario is copied to failures/
// under the run directory (kept), a minimal diff and the seed are printed, the first mismatches
// are shrunk (claims, requests, nodes, slices, devices, selectors dropped while it still fails),
// and the test fails.
func TestDifferential(t *testing.T) {
	bin, batch := deviceletBinary(t)
	n := envInt(t, "DIFF_N", 2000)
	seed0 := uint64(envInt(t, "DIFF_SEED", 1))
	parallel := envInt(t, "DIFF_PARALLEL", min(runtime.NumCPU(), 4))
	maxShrink := envInt(t, "DIFF_SHRINK", 3)
	strictStats := os.Getenv("DIFF_STATS") == "1"

	dir, err := os.MkdirTemp("", "devicelet-diff-")
	if err != nil {
		t.Fatal(err)
	}
	failDir := filepath.Join(dir, "failures")
	start := time.Now()

	// Phase 1: write all scenarios (or take DIFF_FILES, a glob of existing scenario files such as
	// the corpus or gobench -write-dir output; those run per file, "seed" = index).
	var files []string
	if glob := os.Getenv("DIFF_FILES"); glob != "" {
		files, err = filepath.Glob(glob)
		if err != nil || len(files) == 0 {
			t.Fatalf("DIFF_FILES=%s matches no file (%v)", glob, err)
		}
		n, seed0, batch = len(files), 0, false
	} else {
		files = make([]string, n)
	}
	for i := 0; i < n && os.Getenv("DIFF_FILES") == ""; i++ {
		seed := seed0 + uint64(i)
		data, err := harness.MarshalScenarioCompact(gen.Scenario(seed, gen.Config{}))
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		sub := dir
		if batch {
			sub = filepath.Join(dir, fmt.Sprintf("batch-%d", i%parallel))
			if err := os.MkdirAll(sub, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		files[i] = filepath.Join(sub, fmt.Sprintf("scenario-%d.json", seed))
		if err := os.WriteFile(files[i], data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	genTime := time.Since(start)

	// Phase 2 (batch mode only): one devicelet process per batch directory.
	var batchOutcomes sync.Map // scenario name -> outcome
	var batchErr error
	var batchTime time.Duration
	if batch {
		bstart := time.Now()
		var bwg sync.WaitGroup
		var bmu sync.Mutex
		for b := 0; b < parallel && b < n; b++ {
			bwg.Add(1)
			go func(b int) {
				defer bwg.Done()
				outs, _, err := runDeviceletBatch(bin, filepath.Join(dir, fmt.Sprintf("batch-%d", b)))
				bmu.Lock()
				defer bmu.Unlock()
				if err != nil && batchErr == nil {
					batchErr = err
				}
				for name, o := range outs {
					batchOutcomes.Store(name, o)
				}
			}(b)
		}
		bwg.Wait()
		batchTime = time.Since(bstart)
		if batchErr != nil {
			t.Errorf("batch mode: %v", batchErr)
		}
	}

	// Phase 3: run the oracle (and devicelet per file unless batched), DIFF_PARALLEL at a time.
	var (
		mu                sync.Mutex
		failures          []diffFailure
		statMismatches    []string
		statMismatchCount int
		skippedTimeouts   int
		goNanos, rsNanos  atomic.Int64
		next              atomic.Int64
		outcomesSeen      = map[string]int{}
		wg                sync.WaitGroup
	)
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				seed := seed0 + uint64(i)
				var pre any
				if batch {
					o, ok := batchOutcomes.Load(fmt.Sprintf("random-%d", seed))
					if !ok {
						mu.Lock()
						failures = append(failures, diffFailure{seed: seed, file: files[i], err: fmt.Errorf("devicelet --batch printed no outcome named random-%d", seed)})
						mu.Unlock()
						continue
					}
					pre = o
				}
				diffs, statDiffs, goOut, goTime, rsTime, err := compareFile(bin, files[i], strictStats, pre)
				goNanos.Add(goTime.Nanoseconds())
				rsNanos.Add(rsTime.Nanoseconds())
				mu.Lock()
				switch {
				case err == nil && hasTimeout(goOut):
					skippedTimeouts++
				case err != nil || len(diffs) > 0:
					failures = append(failures, diffFailure{seed: seed, file: files[i], diffs: diffs, err: err})
				case len(statDiffs) > 0:
					statMismatchCount++
					if len(statMismatches) < 10 {
						statMismatches = append(statMismatches, fmt.Sprintf("seed %d: %s", seed, statDiffs[0]))
					}
				}
				if goOut != nil {
					for _, no := range goOut.PerNode {
						outcomesSeen[no.Outcome]++
					}
					for _, p := range goOut.Pods {
						outcomesSeen["pod:"+p.Outcome]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	runTime := time.Since(start) - genTime
	if batch {
		rsNanos.Store(batchTime.Nanoseconds())
		t.Logf("devicelet batch mode: %d processes, %v wall", parallel, batchTime.Round(time.Millisecond))
	}

	t.Logf("differential: %d scenarios (seeds %d..%d), %d mismatches, %d timeouts skipped; generate %v, run %v (Go allocator %v, devicelet processes %v, %d in parallel); total %v",
		n, seed0, seed0+uint64(n)-1, len(failures), skippedTimeouts, genTime.Round(time.Millisecond), runTime.Round(time.Millisecond),
		time.Duration(goNanos.Load()).Round(time.Millisecond), time.Duration(rsNanos.Load()).Round(time.Millisecond), parallel, time.Since(start).Round(time.Millisecond))
	t.Logf("Go outcomes seen (per node / per pod): %v", outcomesSeen)
	if statMismatchCount > 0 {
		t.Logf("allocateOneInvocations differs on %d otherwise equal scenarios (informational; DIFF_STATS=1 makes it fail):\n  %s",
			statMismatchCount, strings.Join(statMismatches, "\n  "))
	}
	if len(failures) == 0 {
		_ = os.RemoveAll(dir)
		return
	}
	if err := os.MkdirAll(failDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, f := range failures {
		if i >= 20 {
			t.Errorf("... and %d more mismatches", len(failures)-i)
			break
		}
		data, _ := os.ReadFile(f.file)
		kept := filepath.Join(failDir, filepath.Base(f.file))
		_ = os.WriteFile(kept, data, 0o644)
		if f.err != nil {
			t.Errorf("seed %d (%s): %v", f.seed, kept, f.err)
			continue
		}
		msg := fmt.Sprintf("seed %d: Go allocator and devicelet differ (%s); want=Go, got=devicelet:\n  %s", f.seed, kept, strings.Join(f.diffs, "\n  "))
		if i < maxShrink {
			if small, smallDiffs, ok := shrink(t, bin, f.file, failDir, f.seed, strictStats); ok {
				msg += fmt.Sprintf("\n  shrunk to %s:\n  %s", small, strings.Join(smallDiffs, "\n  "))
			}
		}
		t.Error(msg)
	}
	t.Logf("scenarios kept in %s (rerun one: go run ./cmd/oracle -f FILE; %s allocate -f FILE -o json)", dir, bin)
}

// shrink greedily drops parts of a failing scenario while the engines still disagree, within a
// small time budget. It returns the shrunk file and its differences.
func shrink(t *testing.T, bin, file, failDir string, seed uint64, strictStats bool) (string, []string, bool) {
	s, err := harness.ReadScenarioFile(file)
	if err != nil {
		return "", nil, false
	}
	deadline := time.Now().Add(time.Duration(envInt(t, "DIFF_SHRINK_SECONDS", 30)) * time.Second)
	out := filepath.Join(failDir, fmt.Sprintf("scenario-%d-shrunk.json", seed))
	tmp := filepath.Join(failDir, fmt.Sprintf(".shrink-%d.json", seed))
	defer os.Remove(tmp)
	var lastDiffs []string
	stillFails := func(c *harness.Scenario) bool {
		data, err := harness.MarshalScenario(c)
		if err != nil {
			return false
		}
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return false
		}
		diffs, _, _, _, _, err := compareFile(bin, tmp, strictStats, nil)
		if err != nil || len(diffs) == 0 {
			return false
		}
		lastDiffs = diffs
		return true
	}
	if !stillFails(s) {
		return "", nil, false
	}
	improved := true
	for improved && time.Now().Before(deadline) {
		improved = false
		for _, cand := range shrinkCandidates(s) {
			if time.Now().After(deadline) {
				break
			}
			if stillFails(cand) {
				s = cand
				improved = true
				break
			}
		}
	}
	stillFails(s) // refresh lastDiffs for the final scenario
	data, err := harness.MarshalScenario(s)
	if err != nil || os.WriteFile(out, data, 0o644) != nil {
		return "", nil, false
	}
	return out, lastDiffs, true
}

func cloneScenario(s *harness.Scenario) *harness.Scenario {
	data, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	var c harness.Scenario
	if err := json.Unmarshal(data, &c); err != nil {
		panic(err)
	}
	return &c
}

// shrinkCandidates lists one-step reductions of a scenario, biggest first.
func shrinkCandidates(s *harness.Scenario) []*harness.Scenario {
	var out []*harness.Scenario
	// Big steps first: slices pinned to nodes that are not in the scenario, half of the nodes,
	// the whole allocated state, half of the slices.
	nodes := map[string]bool{}
	for _, n := range s.Nodes {
		nodes[n.Name] = true
	}
	{
		c := cloneScenario(s)
		c.ResourceSlices = c.ResourceSlices[:0]
		for _, sl := range s.ResourceSlices {
			if sl.Spec.NodeName == nil || nodes[*sl.Spec.NodeName] {
				c.ResourceSlices = append(c.ResourceSlices, *sl.DeepCopy())
			}
		}
		if len(c.ResourceSlices) < len(s.ResourceSlices) {
			out = append(out, c)
		}
	}
	if len(s.Nodes) > 1 {
		half := len(s.Nodes) / 2
		a, b := cloneScenario(s), cloneScenario(s)
		a.Nodes, b.Nodes = a.Nodes[:half], b.Nodes[half:]
		out = append(out, a, b)
	}
	if s.Allocated != nil {
		c := cloneScenario(s)
		c.Allocated = nil
		out = append(out, c)
	}
	if len(s.ResourceSlices) > 1 {
		half := len(s.ResourceSlices) / 2
		a, b := cloneScenario(s), cloneScenario(s)
		a.ResourceSlices, b.ResourceSlices = a.ResourceSlices[:half], b.ResourceSlices[half:]
		out = append(out, a, b)
	}
	for i := range s.Nodes {
		if len(s.Nodes) > 1 {
			c := cloneScenario(s)
			c.Nodes = append(c.Nodes[:i], c.Nodes[i+1:]...)
			out = append(out, c)
		}
	}
	for i := range s.Pods {
		c := cloneScenario(s)
		c.Pods = append(c.Pods[:i], c.Pods[i+1:]...)
		out = append(out, c)
	}
	for i := range s.Claims {
		c := cloneScenario(s)
		name := c.Claims[i].Name
		c.Claims = append(c.Claims[:i], c.Claims[i+1:]...)
		still := false
		for _, cl := range c.Claims {
			still = still || cl.Name == name
		}
		for p := range c.Pods {
			var keep []string
			for _, cn := range c.Pods[p].Claims {
				if cn != name || still {
					keep = append(keep, cn)
				}
			}
			c.Pods[p].Claims = keep
		}
		out = append(out, c)
	}
	for i := range s.ResourceSlices {
		c := cloneScenario(s)
		c.ResourceSlices = append(c.ResourceSlices[:i], c.ResourceSlices[i+1:]...)
		out = append(out, c)
	}
	if s.Allocated != nil {
		c := cloneScenario(s)
		c.Allocated = nil
		out = append(out, c)
	}
	for ci, cl := range s.Claims {
		for ri := range cl.Spec.Devices.Requests {
			if len(cl.Spec.Devices.Requests) > 1 {
				c := cloneScenario(s)
				reqs := c.Claims[ci].Spec.Devices.Requests
				c.Claims[ci].Spec.Devices.Requests = append(reqs[:ri], reqs[ri+1:]...)
				c.Claims[ci].Spec.Devices.Constraints = nil
				c.Claims[ci].Spec.Devices.Config = nil
				out = append(out, c)
			}
		}
		if len(cl.Spec.Devices.Constraints) > 0 || len(cl.Spec.Devices.Config) > 0 {
			c := cloneScenario(s)
			c.Claims[ci].Spec.Devices.Constraints = nil
			c.Claims[ci].Spec.Devices.Config = nil
			out = append(out, c)
		}
	}
	for si, sl := range s.ResourceSlices {
		for di := range sl.Spec.Devices {
			if len(sl.Spec.Devices) > 1 {
				c := cloneScenario(s)
				devs := c.ResourceSlices[si].Spec.Devices
				c.ResourceSlices[si].Spec.Devices = append(devs[:di], devs[di+1:]...)
				out = append(out, c)
			}
		}
	}
	for ci := range s.DeviceClasses {
		if len(s.DeviceClasses[ci].Spec.Selectors) > 1 || len(s.DeviceClasses[ci].Spec.Config) > 0 {
			c := cloneScenario(s)
			if len(c.DeviceClasses[ci].Spec.Selectors) > 1 {
				c.DeviceClasses[ci].Spec.Selectors = c.DeviceClasses[ci].Spec.Selectors[:1]
			}
			c.DeviceClasses[ci].Spec.Config = nil
			out = append(out, c)
		}
	}
	return out
}
