// This file: running a scenario through the upstream allocator (spec §5.5): one
// structured.NewAllocator per scenario (per pod in mode: schedule), one Allocate per node, and the
// AllocationOutcome of §5.2/§5.3.
package harness

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// ModuleVersion is the version of k8s.io/dynamic-resource-allocation this module requires
// (keep in sync with go.mod); it names the engine in outcomes.
const ModuleVersion = "v0.36.2"

// Outcome tokens.
const (
	OutcomeAllocated           = "Allocated"
	OutcomeUnschedulable       = "Unschedulable"
	OutcomeUnschedulableOnNode = "UnschedulableOnNode"
	OutcomeTimeout             = "Timeout"
	OutcomeError               = "Error"
)

// NodeStats are informational search statistics.
type NodeStats struct {
	AllocateOneInvocations int64 `json:"allocateOneInvocations"`
}

// NodeTiming is informational timing of one Allocate call.
type NodeTiming struct {
	AllocateNanos int64 `json:"allocateNanos"`
}

// NodeOutcome is the result of one Allocate call on one node.
type NodeOutcome struct {
	Node       string                          `json:"node"`
	Outcome    string                          `json:"outcome"`
	Error      string                          `json:"error"`
	ErrorClass string                          `json:"errorClass,omitempty"`
	Results    *[]resourceapi.AllocationResult `json:"results,omitempty"`
	Stats      *NodeStats                      `json:"stats,omitempty"`
	Timing     *NodeTiming                     `json:"timing,omitempty"`
}

// PodOutcome is one pod of mode: schedule: the first node in `nodes` order that fits is chosen.
type PodOutcome struct {
	Pod     string                          `json:"pod"`
	Node    string                          `json:"node,omitempty"`
	Outcome string                          `json:"outcome"`
	Error   string                          `json:"error"`
	Results *[]resourceapi.AllocationResult `json:"results,omitempty"`
	PerNode []NodeOutcome                   `json:"perNode,omitempty"`
}

// RunTiming is whole-run timing.
type RunTiming struct {
	NewAllocatorNanos int64 `json:"newAllocatorNanos"`
	TotalNanos        int64 `json:"totalNanos"`
}

// Outcome is an AllocationOutcome (spec §5.2).
type Outcome struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Name       string        `json:"name"`
	Engine     string        `json:"engine"`
	PerNode    []NodeOutcome `json:"perNode"`
	Pods       []PodOutcome  `json:"pods,omitempty"`
	Timing     *RunTiming    `json:"timing,omitempty"`
}

// classLister returns the scenario's classes in file order and looks them up by name.
type classLister struct {
	classes []*resourceapi.DeviceClass
}

func (l *classLister) List() ([]*resourceapi.DeviceClass, error) { return l.classes, nil }

func (l *classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l.classes {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclass"}, name)
}

// allocatorMutex serialises structured.EnableAllocators + NewAllocator (EnableAllocators sets a
// package-level variable).
var allocatorMutex sync.Mutex

// variantOf returns the allocator variant the scenario asks for (default incubating).
func variantOf(s *Scenario) string {
	if s.Semantics.Variant == "" {
		return "incubating"
	}
	return s.Semantics.Variant
}

// Engine names the engine in outcomes.
func Engine(s *Scenario) string {
	compat := s.Semantics.Compat
	if compat == "" {
		compat = "k8s-v1.36.1"
	}
	return fmt.Sprintf("go-%s@%s (k8s.io/dynamic-resource-allocation %s)", variantOf(s), compat, ModuleVersion)
}

func (s *Scenario) structuredFeatures() structured.Features {
	f := s.Features
	return structured.Features{
		AdminAccess:            f.AdminAccess,
		ConsumableCapacity:     f.ConsumableCapacity,
		DeviceBindingAndStatus: f.DeviceBindingAndStatus,
		DeviceTaints:           f.DeviceTaints,
		ListTypeAttributes:     f.ListTypeAttributes,
		PartitionableDevices:   f.PartitionableDevices,
		PrioritizedList:        f.PrioritizedList,
	}
}

func (s *Scenario) celFeatures() cel.Features {
	if s.CEL != nil {
		return cel.Features{EnableConsumableCapacity: s.CEL.EnableConsumableCapacity, EnableListTypeAttributes: s.CEL.EnableListTypeAttributes}
	}
	return cel.Features{EnableConsumableCapacity: s.Features.ConsumableCapacity, EnableListTypeAttributes: s.Features.ListTypeAttributes}
}

// NewCELCache returns a CEL cache for the scenario (same size as the scheduler's).
func (s *Scenario) NewCELCache() *cel.Cache { return cel.NewCache(10, s.celFeatures()) }

// AllocatedState builds the AllocatedState from `allocated` (state + claims, merged).
func (s *Scenario) AllocatedState() (structured.AllocatedState, error) {
	st := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	if s.Allocated == nil {
		return st, nil
	}
	if ex := s.Allocated.State; ex != nil {
		for _, d := range ex.Devices {
			st.AllocatedDevices.Insert(structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
		}
		for _, d := range ex.SharedDevices {
			uid := types.UID(d.ShareID)
			st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(structured.MakeDeviceID(d.Driver, d.Pool, d.Device), &uid))
		}
		for _, d := range ex.ConsumedCapacity {
			caps := map[resourceapi.QualifiedName]resource.Quantity{}
			for k, v := range d.Capacity {
				q, err := resource.ParseQuantity(v)
				if err != nil {
					return st, fmt.Errorf("allocated.state.consumedCapacity %s/%s/%s %s: %w", d.Driver, d.Pool, d.Device, k, err)
				}
				caps[resourceapi.QualifiedName(k)] = q
			}
			st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(structured.MakeDeviceID(d.Driver, d.Pool, d.Device), caps))
		}
	}
	for i := range s.Allocated.Claims {
		c := &s.Allocated.Claims[i]
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			AddResultToState(&st, r, s.Features.ConsumableCapacity)
		}
	}
	return st, nil
}

// AddResultToState records one allocated device the way the scheduler does
// (dynamicresources/allocateddevices.go): admin access is skipped; with ConsumableCapacity a
// result with a shareID is a share (plus its consumed capacity), everything else is exclusive.
func AddResultToState(st *structured.AllocatedState, r resourceapi.DeviceRequestAllocationResult, consumableCapacity bool) {
	if r.AdminAccess != nil && *r.AdminAccess {
		return
	}
	id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
	if consumableCapacity && r.ShareID != nil {
		st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
		return
	}
	st.AllocatedDevices.Insert(id)
}

// CELCaches shares compiled CEL programs across scenarios with the same CEL features (compilation
// is deterministic, so sharing changes nothing but time). Safe for concurrent use.
type CELCaches struct {
	mu     sync.Mutex
	caches map[cel.Features]*cel.Cache
}

// NewCELCaches returns an empty cache pool.
func NewCELCaches() *CELCaches { return &CELCaches{caches: map[cel.Features]*cel.Cache{}} }

func (c *CELCaches) get(f cel.Features) *cel.Cache {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cache, ok := c.caches[f]; ok {
		return cache
	}
	cache := cel.NewCache(4096, f)
	c.caches[f] = cache
	return cache
}

// RunOptions tunes RunWith.
type RunOptions struct {
	// CELCaches, if set, replaces the per-scenario CEL cache.
	CELCaches *CELCaches
}

// Run executes the scenario through the upstream allocator.
func Run(ctx context.Context, s *Scenario) *Outcome {
	return RunWith(ctx, s, RunOptions{})
}

// RunWith executes the scenario through the upstream allocator.
func RunWith(ctx context.Context, s *Scenario, opts RunOptions) *Outcome {
	start := time.Now()
	out := &Outcome{APIVersion: APIVersion, Kind: "AllocationOutcome", Name: s.Name, Engine: Engine(s), PerNode: []NodeOutcome{}}
	classes := make([]*resourceapi.DeviceClass, len(s.DeviceClasses))
	for i := range s.DeviceClasses {
		classes[i] = &s.DeviceClasses[i]
	}
	lister := &classLister{classes: classes}
	slices := make([]*resourceapi.ResourceSlice, len(s.ResourceSlices))
	for i := range s.ResourceSlices {
		slices[i] = &s.ResourceSlices[i]
	}
	celCache := s.NewCELCache()
	if opts.CELCaches != nil {
		celCache = opts.CELCaches.get(s.celFeatures())
	}
	state, err := s.AllocatedState()
	if err != nil {
		for i := range s.Nodes {
			out.PerNode = append(out.PerNode, NodeOutcome{Node: s.Nodes[i].Name, Outcome: OutcomeError, Error: err.Error(), ErrorClass: "InvalidInput"})
		}
		return out
	}
	var newAllocatorNanos int64
	newAllocator := func(st structured.AllocatedState) (structured.Allocator, error) {
		t := time.Now()
		allocatorMutex.Lock()
		structured.EnableAllocators(variantOf(s))
		a, err := structured.NewAllocator(ctx, s.structuredFeatures(), st, lister, slices, celCache)
		structured.EnableAllocators()
		allocatorMutex.Unlock()
		newAllocatorNanos += time.Since(t).Nanoseconds()
		return a, err
	}
	switch s.Mode {
	case "schedule":
		claimByName := map[string]*resourceapi.ResourceClaim{}
		for i := range s.Claims {
			if _, dup := claimByName[s.Claims[i].Name]; !dup {
				claimByName[s.Claims[i].Name] = &s.Claims[i]
			}
		}
		done := sets.New[string]()
		for _, pod := range s.Pods {
			var claims []*resourceapi.ResourceClaim
			for _, name := range pod.Claims {
				if !done.Has(name) {
					claims = append(claims, claimByName[name])
				}
			}
			rec := PodOutcome{Pod: pod.Name, Outcome: OutcomeUnschedulable}
			a, err := newAllocator(state)
			for i := range s.Nodes {
				var no NodeOutcome
				if err != nil {
					no = NodeOutcome{Node: s.Nodes[i].Name, Outcome: OutcomeError, Error: err.Error(), ErrorClass: ClassifyError(err.Error())}
				} else {
					no = allocateOnNode(ctx, s, a, &s.Nodes[i], claims)
				}
				success := no.Outcome == OutcomeAllocated
				if success && rec.Node == "" {
					rec.Node = no.Node
					rec.Outcome = OutcomeAllocated
					rec.Results = no.Results
				} else if rec.Node == "" && no.Outcome == OutcomeError && rec.Error == "" {
					// A fatal error aborts the pod's scheduling attempt.
					rec.Outcome = OutcomeError
					rec.Error = no.Error
				}
				rec.PerNode = append(rec.PerNode, no)
				if rec.Outcome == OutcomeError || (success && s.FirstFit) {
					break
				}
			}
			if rec.Results != nil {
				for ci, res := range *rec.Results {
					done.Insert(claims[ci].Name)
					for _, r := range res.Devices.Results {
						AddResultToState(&state, r, s.Features.ConsumableCapacity)
					}
				}
			}
			out.Pods = append(out.Pods, rec)
		}
	default:
		claims := make([]*resourceapi.ResourceClaim, len(s.Claims))
		for i := range s.Claims {
			claims[i] = &s.Claims[i]
		}
		a, err := newAllocator(state)
		for i := range s.Nodes {
			if err != nil {
				out.PerNode = append(out.PerNode, NodeOutcome{Node: s.Nodes[i].Name, Outcome: OutcomeError, Error: err.Error(), ErrorClass: ClassifyError(err.Error())})
				continue
			}
			out.PerNode = append(out.PerNode, allocateOnNode(ctx, s, a, &s.Nodes[i], claims))
		}
	}
	out.Timing = &RunTiming{NewAllocatorNanos: newAllocatorNanos, TotalNanos: time.Since(start).Nanoseconds()}
	return out
}

// allocateOne is one Allocate call with outcome classification.
func allocateOnNode(ctx context.Context, s *Scenario, a structured.Allocator, node *v1.Node, claims []*resourceapi.ResourceClaim) NodeOutcome {
	callCtx := ctx
	if s.TimeoutSeconds > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(ctx, time.Duration(s.TimeoutSeconds*float64(time.Second)))
		defer cancel()
	}
	before := allocateOneInvocations(a)
	t := time.Now()
	results, err := a.Allocate(callCtx, node, claims)
	nanos := time.Since(t).Nanoseconds()
	no := NodeOutcome{
		Node:   node.Name,
		Stats:  &NodeStats{AllocateOneInvocations: allocateOneInvocations(a) - before},
		Timing: &NodeTiming{AllocateNanos: nanos},
	}
	switch {
	case err == nil && (results != nil || len(claims) == 0):
		no.Outcome = OutcomeAllocated
		if results == nil {
			results = []resourceapi.AllocationResult{}
		}
		no.Results = &results
	case err == nil:
		no.Outcome = OutcomeUnschedulable
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		no.Outcome = OutcomeTimeout
		no.Error = err.Error()
		no.ErrorClass = "Timeout"
	case errors.Is(err, structured.ErrFailedAllocationOnNode):
		no.Outcome = OutcomeUnschedulableOnNode
		no.Error = err.Error()
		no.ErrorClass = "InvalidPools"
	default:
		no.Outcome = OutcomeError
		no.Error = err.Error()
		no.ErrorClass = ClassifyError(no.Error)
	}
	return no
}

// allocateOneInvocations reads the allocator's search-step counter. It is only reachable through
// the internal AllocatorExtended interface (GetStats() internal.Stats), whose result type cannot
// be named outside the module, hence reflection. Returns 0 when the variant has no stats.
func allocateOneInvocations(a structured.Allocator) int64 {
	m := reflect.ValueOf(a).MethodByName("GetStats")
	if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 {
		return 0
	}
	stats := m.Call(nil)[0]
	if stats.Kind() != reflect.Struct {
		return 0
	}
	f := stats.FieldByName("NumAllocateOneInvocations")
	if !f.IsValid() || f.Kind() != reflect.Int64 {
		return 0
	}
	return f.Int()
}

// ClassifyError maps an allocator error text to the stable errorClass token of §5.2 / the
// corpus README (matched by substring, like the corpus).
func ClassifyError(msg string) string {
	for _, c := range []struct{ needle, class string }{
		{"CEL compile error", "CELCompile"},
		{"CEL runtime error", "CELRuntime"},
		{"is currently being updated", "AllModeIncompletePool"},
		{"asks for all devices, but resource pool", "AllModeInvalidPool"},
		{"constraint would not be satisfied", "ConstraintMust"},
		{"exceeds the claim limit", "ClaimLimit"},
		{"could not retrieve device class", "UnknownClass"},
		{"missing device class name", "MissingClassName"},
		{"feature is disabled", "FeatureDisabled"},
		{"unsupported count mode", "UnknownMode"},
		{"CEL expression empty", "EmptySelector"},
		{"empty constraint", "EmptyConstraint"},
		{"invalid resource pools were encountered", "InvalidPools"},
		{"create NodeSelector", "NodeSelectorParse"},
		{"gather pool information", "NodeSelectorParse"},
	} {
		if strings.Contains(msg, c.needle) {
			return c.class
		}
	}
	return "Other"
}
