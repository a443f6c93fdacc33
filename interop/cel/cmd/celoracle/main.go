// Command celoracle compiles CEL selector expressions with Kubernetes' own DRA CEL
// compiler (k8s.io/dynamic-resource-allocation/cel, StoredExpressions environment) and
// prints, for each, whether it compiles and the error text. It is the reference for
// devicelet-cel's static type checker.
//
// Input: a JSON array of strings (file given with -f, or stdin), or with -lines one
// expression per line. Output: a JSON array of {"expr","ok","error"}.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"devicelet.invalid/interop/cel/oracle"
)

func main() {
	file := flag.String("f", "", "input file (default stdin)")
	lines := flag.Bool("lines", false, "input is one expression per line instead of a JSON array")
	listAttrs := flag.Bool("list-type-attributes", false, "enable EnableListTypeAttributes")
	consumable := flag.Bool("consumable-capacity", true, "enable EnableConsumableCapacity")
	flag.Parse()

	var in io.Reader = os.Stdin
	if *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer f.Close()
		in = f
	}
	var exprs []string
	if *lines {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			exprs = append(exprs, sc.Text())
		}
	} else if err := json.NewDecoder(in).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "decode input:", err)
		os.Exit(2)
	}
	features := oracle.Features{ConsumableCapacity: *consumable, ListTypeAttributes: *listAttrs}
	out := make([]oracle.Verdict, 0, len(exprs))
	for _, e := range exprs {
		out = append(out, oracle.Compile(e, features))
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}
