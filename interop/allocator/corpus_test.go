package allocatorinterop_test

import (
	"context"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"devicelet.invalid/interop/allocator/harness"
)

// TestOracleReproducesCorpus replays every case of the shared conformance corpus through the
// upstream allocator (the oracle) and checks its `expect` under the corpus README's rules:
// outcome strictly, results strictly in order (shareIDs and quantities normalised), error text
// starting with errorPrefix, and allocateOneInvocations on every case (the corpus records them
// for all 198; README rule 4 requires them where checkStats is set).
func TestOracleReproducesCorpus(t *testing.T) {
	start := time.Now()
	dir := filepath.Join(sharedDir(t), "conformance", "allocator", "cases")
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	if len(files) < 198 {
		t.Fatalf("expected at least 198 corpus cases in %s, found %d", dir, len(files))
	}
	failed := 0
	warnings := 0
	for _, f := range files {
		s, err := harness.ReadScenarioFile(f)
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
			failed++
			continue
		}
		if len(s.Expect) == 0 {
			t.Errorf("%s: no expect block", filepath.Base(f))
			failed++
			continue
		}
		out := harness.Run(context.Background(), s)
		mismatches, warns, err := harness.CheckExpect(s.Expect, out, harness.ExpectCheck{AllStats: true})
		if err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
			failed++
			continue
		}
		warnings += len(warns)
		for _, w := range warns {
			t.Logf("%s: warning: %s", filepath.Base(f), w)
		}
		if len(mismatches) > 0 {
			failed++
			for _, m := range mismatches {
				t.Errorf("%s: %s", filepath.Base(f), m)
			}
		}
	}
	t.Logf("corpus: %d cases, %d failed, %d warnings, %v", len(files), failed, warnings, time.Since(start))
}
