// Package oracle wraps Kubernetes' DRA CEL compiler
// (k8s.io/dynamic-resource-allocation/cel, v0.36.2) for the devicelet-cel parity test.
package oracle

import (
	"fmt"

	dracel "k8s.io/dynamic-resource-allocation/cel"
)

// Features selects the DRA CEL feature set.
type Features struct {
	ConsumableCapacity bool `json:"consumableCapacity"`
	ListTypeAttributes bool `json:"listTypeAttributes"`
}

// Verdict is the outcome of compiling one expression.
type Verdict struct {
	Expr  string `json:"expr"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Panic is set when cel-go panicked while compiling (e.g. a map literal with a
	// bytes key: "hash of unhashable type types.Bytes" in the constant folder).
	Panic string `json:"panic,omitempty"`
}

// Compile compiles expr the way the scheduler's DRA plugin does (cost estimation off,
// as in dynamic-resource-allocation/cel/cache.go).
func Compile(expr string, f Features) (verdict Verdict) {
	defer func() {
		if r := recover(); r != nil {
			verdict = Verdict{Expr: expr, OK: false, Panic: fmt.Sprint(r)}
		}
	}()
	compiler := dracel.GetCompiler(dracel.Features{
		EnableConsumableCapacity: f.ConsumableCapacity,
		EnableListTypeAttributes: f.ListTypeAttributes,
	})
	result := compiler.CompileCELExpression(expr, dracel.Options{DisableCostEstimation: true})
	if result.Error != nil {
		return Verdict{Expr: expr, OK: false, Error: result.Error.Detail}
	}
	return Verdict{Expr: expr, OK: true}
}
