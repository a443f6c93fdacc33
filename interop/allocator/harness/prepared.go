// This file: a prepared scenario for throughput measurements (cmd/gobench): the objects are
// converted once, then each "pod" is one structured.NewAllocator (PreFilter) plus Allocate calls
// (Filter), as in the scheduler's DRA plugin.
package harness

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Prepared holds a scenario's inputs in the form the allocator takes.
type Prepared struct {
	s        *Scenario
	lister   *classLister
	slices   []*resourceapi.ResourceSlice
	claims   []*resourceapi.ResourceClaim
	celCache *cel.Cache
	state    structured.AllocatedState
}

// Prepare converts a scenario once (one CEL cache for all pods, like the scheduler).
func Prepare(s *Scenario) (*Prepared, error) {
	p := &Prepared{s: s, lister: &classLister{}, celCache: s.NewCELCache()}
	for i := range s.DeviceClasses {
		p.lister.classes = append(p.lister.classes, &s.DeviceClasses[i])
	}
	for i := range s.ResourceSlices {
		p.slices = append(p.slices, &s.ResourceSlices[i])
	}
	for i := range s.Claims {
		p.claims = append(p.claims, &s.Claims[i])
	}
	st, err := s.AllocatedState()
	if err != nil {
		return nil, err
	}
	p.state = st
	return p, nil
}

func (p *Prepared) newAllocator(ctx context.Context, st structured.AllocatedState) (structured.Allocator, error) {
	allocatorMutex.Lock()
	defer allocatorMutex.Unlock()
	structured.EnableAllocators(variantOf(p.s))
	defer structured.EnableAllocators()
	return structured.NewAllocator(ctx, p.s.structuredFeatures(), st, p.lister, p.slices, p.celCache)
}

// SchedulePodAllNodes is one pod's allocator work with the scenario's claims: a new allocator and
// one Allocate per node. It returns how many nodes fit; a fatal error is returned as error.
func (p *Prepared) SchedulePodAllNodes(ctx context.Context) (int, error) {
	a, err := p.newAllocator(ctx, p.state)
	if err != nil {
		return 0, err
	}
	fit := 0
	for i := range p.s.Nodes {
		res, err := a.Allocate(ctx, &p.s.Nodes[i], p.claims)
		if err != nil {
			return fit, fmt.Errorf("node %s: %w", p.s.Nodes[i].Name, err)
		}
		if res != nil {
			fit++
		}
	}
	return fit, nil
}

func cloneState(st structured.AllocatedState) structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         st.AllocatedDevices.Clone(),
		AllocatedSharedDeviceIDs: st.AllocatedSharedDeviceIDs.Clone(),
		AggregatedCapacity:       st.AggregatedCapacity.Clone(),
	}
}

// FillUp schedules the scenario's pods (mode: schedule) one after the other from the initial
// state: per pod a new allocator, Allocate on the nodes in order until the first fit, commit.
// Nodes on which an earlier pod did not fit are not tried again (they only fill up), which is what
// devicelet's fill-up benchmark does too. It returns how many pods were placed.
func (p *Prepared) FillUp(ctx context.Context) (int, error) {
	state := cloneState(p.state)
	byName := map[string]*resourceapi.ResourceClaim{}
	for _, c := range p.claims {
		byName[c.Name] = c
	}
	done := sets.New[string]()
	placed, startNode := 0, 0
	for _, pod := range p.s.Pods {
		var claims []*resourceapi.ResourceClaim
		for _, name := range pod.Claims {
			if !done.Has(name) {
				claims = append(claims, byName[name])
			}
		}
		a, err := p.newAllocator(ctx, state)
		if err != nil {
			return placed, err
		}
		var results []resourceapi.AllocationResult
		for ni := startNode; ni < len(p.s.Nodes); ni++ {
			res, err := a.Allocate(ctx, &p.s.Nodes[ni], claims)
			if err != nil {
				return placed, fmt.Errorf("pod %s, node %s: %w", pod.Name, p.s.Nodes[ni].Name, err)
			}
			if res != nil {
				results = res
				break
			}
			startNode = ni + 1
		}
		if results == nil {
			return placed, nil
		}
		for ci, r := range results {
			done.Insert(claims[ci].Name)
			for _, d := range r.Devices.Results {
				AddResultToState(&state, d, p.s.Features.ConsumableCapacity)
			}
		}
		placed++
	}
	return placed, nil
}
