// Command schemacheck validates CDI spec files with the upstream CDI schema package
// (tags.cncf.io/container-device-interface/schema): the official JSON schema (schema.json +
// defs.json, embedded in the package) plus the package's extra content checks (annotations).
//
// It is its own module because the schema package is published only up to
// tags.cncf.io/container-device-interface v0.8.1; later releases moved it into a separate
// module that is not on the Go module proxy, while parsing CDI 1.0.0 specs needs pkg/cdi
// v1.x (the parent module). The top-level schema.json is unchanged between those releases.
//
// Usage: go run . FILE... (exit 1 if any file is invalid).
package main

import (
	"fmt"
	"os"

	"tags.cncf.io/container-device-interface/schema"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: schemacheck FILE...")
		os.Exit(2)
	}
	s := schema.BuiltinSchema()
	failed := false
	for _, f := range os.Args[1:] {
		if err := s.ValidateFile(f); err != nil {
			fmt.Printf("INVALID %s: %v\n", f, err)
			failed = true
			continue
		}
		fmt.Printf("VALID %s\n", f)
	}
	if failed {
		os.Exit(1)
	}
}
