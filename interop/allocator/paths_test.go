// Package allocatorinterop_test holds the Go interop tests for devicelet's DRA structured
// allocator: TestOracleReproducesCorpus (the upstream Go allocator replays the shared conformance
// corpus) and TestDifferential (upstream Go allocator vs `devicelet allocate` on generated
// scenarios). See ../../../shared/spec/structured-allocator.md §5.
package allocatorinterop_test

import (
	"os"
	"path/filepath"
	"testing"
)

// sharedDir is $DEVICELET_SHARED or ../../../shared relative to this module.
func sharedDir(t testing.TB) string {
	if d := os.Getenv("DEVICELET_SHARED"); d != "" {
		return d
	}
	d, err := filepath.Abs(filepath.Join("..", "..", "..", "shared"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
