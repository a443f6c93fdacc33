// Command oracle runs an AllocationScenario (../shared/spec/structured-allocator.md §5.1, JSON or
// YAML) through the upstream Go DRA structured allocator (k8s.io/dynamic-resource-allocation,
// variant incubating unless the scenario says otherwise) and prints the AllocationOutcome (§5.2,
// §5.3) in the corpus format.
//
//	oracle -f scenario.json [-o json|yaml] [-check]
//	oracle allocate -f scenario.json -o json     (same; devicelet's command line)
//	oracle allocate --batch DIR -o json          (JSON lines, one outcome per *.json in DIR)
//
// With -check the outcome is also compared with the scenario's `expect` block under the corpus
// README's rules; the exit status is 1 on a mismatch.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"sigs.k8s.io/yaml"

	"devicelet.invalid/interop/allocator/harness"
)

func main() {
	// `oracle allocate -f FILE -o json` is accepted too, so that the oracle can stand in for
	// devicelet (DEVICELET_BIN) when checking the differential harness itself.
	if len(os.Args) > 1 && os.Args[1] == "allocate" {
		os.Args = append(os.Args[:1], os.Args[2:]...)
	}
	file := flag.String("f", "", "scenario file (JSON or YAML); - for stdin")
	output := flag.String("o", "json", "output format: json | yaml")
	check := flag.Bool("check", false, "compare with the scenario's expect block (corpus rules); exit 1 on mismatch")
	noTiming := flag.Bool("no-timing", false, "omit timing fields")
	batch := flag.String("batch", "", "--batch DIR: run every *.json scenario in DIR (lexical order) and print one outcome per line (JSON lines)")
	flag.Parse()
	if *batch != "" {
		os.Exit(runBatch(*batch, *noTiming))
	}
	if *file == "" && flag.NArg() == 1 {
		*file = flag.Arg(0)
	}
	if *file == "" {
		fmt.Fprintln(os.Stderr, "usage: oracle -f SCENARIO [-o json|yaml] [-check]")
		os.Exit(2)
	}
	var data []byte
	var err error
	if *file == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(*file)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "oracle:", err)
		os.Exit(2)
	}
	s, err := harness.ParseScenario(data)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oracle:", err)
		os.Exit(2)
	}
	out := harness.Run(context.Background(), s)
	if *noTiming {
		stripTiming(out)
	}
	var text []byte
	switch *output {
	case "json":
		text, err = json.MarshalIndent(out, "", "  ")
	case "yaml":
		text, err = yaml.Marshal(out)
	default:
		err = fmt.Errorf("unknown output format %q", *output)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "oracle:", err)
		os.Exit(2)
	}
	fmt.Println(string(text))
	if *check {
		if len(s.Expect) == 0 {
			fmt.Fprintln(os.Stderr, "oracle: -check: the scenario has no expect block")
			os.Exit(2)
		}
		mismatches, warnings, err := harness.CheckExpect(s.Expect, out, harness.ExpectCheck{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "oracle:", err)
			os.Exit(2)
		}
		for _, w := range warnings {
			fmt.Fprintln(os.Stderr, "warning:", w)
		}
		for _, m := range mismatches {
			fmt.Fprintln(os.Stderr, "MISMATCH:", m)
		}
		if len(mismatches) > 0 {
			os.Exit(1)
		}
	}
}

func stripTiming(out *harness.Outcome) {
	out.Timing = nil
	for i := range out.PerNode {
		out.PerNode[i].Timing = nil
	}
	for i := range out.Pods {
		for j := range out.Pods[i].PerNode {
			out.Pods[i].PerNode[j].Timing = nil
		}
	}
}

// runBatch is the batch protocol TestDifferential uses when devicelet offers it: one compact
// AllocationOutcome per line for every *.json file in dir, in lexical order.
func runBatch(dir string, noTiming bool) int {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "oracle:", err)
		return 2
	}
	sort.Strings(files)
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	status := 0
	for _, f := range files {
		s, err := harness.ReadScenarioFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "oracle:", err)
			status = 2
			continue
		}
		out := harness.Run(context.Background(), s)
		if noTiming {
			stripTiming(out)
		}
		line, err := json.Marshal(out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "oracle:", err)
			return 2
		}
		w.Write(line)
		w.WriteByte('\n')
	}
	return status
}
