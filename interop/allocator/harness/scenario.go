// Package harness reads the neutral AllocationScenario format of
// ../shared/spec/structured-allocator.md §5.1, runs it through the upstream Go DRA structured
// allocator (k8s.io/dynamic-resource-allocation/structured, variant selected by
// `semantics.variant`, default incubating) and produces the AllocationOutcome of §5.2/§5.3. It also
// implements the normalisation and comparison rules of §5.4 and of the conformance corpus README.
//
// This file: the scenario type, decoding (JSON or YAML), empty-list stripping and API defaulting.
package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// APIVersion is the harness schema version (not a Kubernetes API).
const APIVersion = "dra-harness/v1alpha1"

// Semantics selects which Go behaviour to reproduce.
type Semantics struct {
	Variant string `json:"variant,omitempty"`
	Compat  string `json:"compat,omitempty"`
}

// Features mirrors structured.Features with the JSON names of the scenario format.
type Features struct {
	AdminAccess            bool `json:"AdminAccess"`
	ConsumableCapacity     bool `json:"ConsumableCapacity"`
	DeviceBindingAndStatus bool `json:"DeviceBindingAndStatus"`
	DeviceTaints           bool `json:"DeviceTaints"`
	ListTypeAttributes     bool `json:"ListTypeAttributes"`
	PartitionableDevices   bool `json:"PartitionableDevices"`
	PrioritizedList        bool `json:"PrioritizedList"`
}

// AllIncubatingFeatures is the 1.36 default feature set (selects incubating).
var AllIncubatingFeatures = Features{
	AdminAccess: true, ConsumableCapacity: true, DeviceBindingAndStatus: true, DeviceTaints: true,
	PartitionableDevices: true, PrioritizedList: true,
}

// CELOptions are the CEL compiler features.
type CELOptions struct {
	EnableConsumableCapacity bool `json:"EnableConsumableCapacity"`
	EnableListTypeAttributes bool `json:"EnableListTypeAttributes"`
}

// StateDevice is one exclusively allocated device.
type StateDevice struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
}

// StateShare is one share of a multi-allocatable device.
type StateShare struct {
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	ShareID string `json:"shareID"`
}

// StateCapacity is the aggregated consumed capacity of one device.
type StateCapacity struct {
	Driver   string            `json:"driver"`
	Pool     string            `json:"pool"`
	Device   string            `json:"device"`
	Capacity map[string]string `json:"capacity,omitempty"`
}

// State is the explicit AllocatedState.
type State struct {
	Devices          []StateDevice   `json:"devices,omitempty"`
	SharedDevices    []StateShare    `json:"sharedDevices,omitempty"`
	ConsumedCapacity []StateCapacity `json:"consumedCapacity,omitempty"`
}

// Allocated is the state of other claims (both forms are merged).
type Allocated struct {
	Claims []resourceapi.ResourceClaim `json:"claims,omitempty"`
	State  *State                      `json:"state,omitempty"`
}

// Pod is one pod of mode: schedule; Claims are claim metadata.name values.
type Pod struct {
	Name   string   `json:"name"`
	Claims []string `json:"claims,omitempty"`
}

// Scenario is an AllocationScenario (spec §5.1).
type Scenario struct {
	APIVersion       string                      `json:"apiVersion"`
	Kind             string                      `json:"kind"`
	Name             string                      `json:"name"`
	Semantics        Semantics                   `json:"semantics"`
	Features         Features                    `json:"features"`
	CEL              *CELOptions                 `json:"cel,omitempty"`
	ApplyAPIDefaults *bool                       `json:"applyAPIDefaults,omitempty"`
	TimeoutSeconds   float64                     `json:"timeoutSeconds,omitempty"`
	Nodes            []v1.Node                   `json:"nodes"`
	DeviceClasses    []resourceapi.DeviceClass   `json:"deviceClasses"`
	ResourceSlices   []resourceapi.ResourceSlice `json:"resourceSlices"`
	Claims           []resourceapi.ResourceClaim `json:"claims"`
	Allocated        *Allocated                  `json:"allocated,omitempty"`
	Mode             string                      `json:"mode,omitempty"`
	Pods             []Pod                       `json:"pods,omitempty"`
	FirstFit         bool                        `json:"firstFit,omitempty"`
	// Expect is the corpus' expected outcome (not used when running).
	Expect json.RawMessage `json:"expect,omitempty"`
}

// ReadScenarioFile reads a scenario from a JSON or YAML file.
func ReadScenarioFile(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := ParseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ParseScenario decodes a scenario from JSON or YAML. Empty lists inside the Kubernetes objects are
// removed before typed decoding (spec §5.1: an empty list means absent; Go orders pools with
// non-nil bindingConditions last, so `[]` must not become a non-nil slice).
func ParseScenario(data []byte) (*Scenario, error) {
	jsonData := data
	if trimmed := bytes.TrimSpace(data); len(trimmed) == 0 || trimmed[0] != '{' {
		// YAML (JSON input skips the slower YAML parser).
		var err error
		if jsonData, err = yaml.YAMLToJSON(data); err != nil {
			return nil, fmt.Errorf("parse scenario: %w", err)
		}
	}
	if !emptyList.Match(jsonData) {
		// Fast path: no empty list anywhere, so there is nothing to strip (nulls decode as absent).
		var s Scenario
		if err := json.Unmarshal(jsonData, &s); err != nil {
			return nil, fmt.Errorf("decode scenario: %w", err)
		}
		if err := s.checkRaw(jsonData); err != nil {
			return nil, err
		}
		return s.finish()
	}
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("parse scenario: %w", err)
	}
	obj, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("parse scenario: a scenario must be an object")
	}
	if err := checkHeader(obj); err != nil {
		return nil, err
	}
	for _, key := range []string{"nodes", "deviceClasses", "resourceSlices", "claims", "allocated"} {
		if v, ok := obj[key]; ok {
			obj[key] = stripEmpty(v)
		}
	}
	clean, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var s Scenario
	if err := json.Unmarshal(clean, &s); err != nil {
		return nil, fmt.Errorf("decode scenario: %w", err)
	}
	return s.finish()
}

var emptyList = regexp.MustCompile(`\[\s*\]`)

// checkRaw applies the header and apiVersion checks of the slow path to raw JSON.
func (s *Scenario) checkRaw(jsonData []byte) error {
	type versioned struct {
		APIVersion string `json:"apiVersion"`
	}
	var raw struct {
		APIVersion     string      `json:"apiVersion"`
		Kind           string      `json:"kind"`
		DeviceClasses  []versioned `json:"deviceClasses"`
		ResourceSlices []versioned `json:"resourceSlices"`
		Claims         []versioned `json:"claims"`
		Allocated      *struct {
			Claims []versioned `json:"claims"`
		} `json:"allocated"`
	}
	if err := json.Unmarshal(jsonData, &raw); err != nil {
		return fmt.Errorf("parse scenario: %w", err)
	}
	obj := map[string]any{}
	if raw.APIVersion != "" {
		obj["apiVersion"] = raw.APIVersion
	}
	if raw.Kind != "" {
		obj["kind"] = raw.Kind
	}
	list := func(vs []versioned) []any {
		out := make([]any, len(vs))
		for i, v := range vs {
			out[i] = map[string]any{"apiVersion": v.APIVersion}
		}
		return out
	}
	obj["deviceClasses"] = list(raw.DeviceClasses)
	obj["resourceSlices"] = list(raw.ResourceSlices)
	obj["claims"] = list(raw.Claims)
	if raw.Allocated != nil {
		obj["allocated"] = map[string]any{"claims": list(raw.Allocated.Claims)}
	}
	return checkHeader(obj)
}

func checkHeader(obj map[string]any) error {
	if av, ok := obj["apiVersion"].(string); ok && av != APIVersion {
		return fmt.Errorf("apiVersion: expected %q, got %q", APIVersion, av)
	}
	if k, ok := obj["kind"].(string); ok && k != "AllocationScenario" {
		return fmt.Errorf("kind: expected \"AllocationScenario\", got %q", k)
	}
	for _, key := range []string{"deviceClasses", "resourceSlices", "claims"} {
		if err := checkResourceAPIVersions(key, obj[key]); err != nil {
			return err
		}
	}
	if a, ok := obj["allocated"].(map[string]any); ok {
		if err := checkResourceAPIVersions("allocated.claims", a["claims"]); err != nil {
			return err
		}
	}
	return nil
}

// finish validates the decoded scenario and applies the defaults.
func (s *Scenario) finish() (*Scenario, error) {
	if s.Mode == "" {
		s.Mode = "allocate"
	}
	if s.Mode != "allocate" && s.Mode != "schedule" {
		return nil, fmt.Errorf("mode: unknown mode %q (allocate | schedule)", s.Mode)
	}
	for i := range s.Nodes {
		if s.Nodes[i].Name == "" {
			return nil, fmt.Errorf("nodes[%d].metadata.name: required", i)
		}
	}
	if s.Mode == "schedule" {
		names := map[string]bool{}
		for i := range s.Claims {
			names[s.Claims[i].Name] = true
		}
		for i, p := range s.Pods {
			for _, c := range p.Claims {
				if !names[c] {
					return nil, fmt.Errorf("pods[%d].claims: unknown claim %q", i, c)
				}
			}
		}
	}
	if s.ApplyAPIDefaults == nil || *s.ApplyAPIDefaults {
		for i := range s.Claims {
			ApplyAPIDefaults(&s.Claims[i])
		}
	}
	return s, nil
}

func checkResourceAPIVersions(key string, v any) error {
	list, _ := v.([]any)
	for i, item := range list {
		m, _ := item.(map[string]any)
		av, _ := m["apiVersion"].(string)
		switch av {
		case "", "resource.k8s.io/v1", "resource.k8s.io/v1beta2":
		default:
			return fmt.Errorf("%s[%d].apiVersion: unsupported apiVersion %q (use resource.k8s.io/v1 or v1beta2)", key, i, av)
		}
	}
	return nil
}

// stripEmpty removes nulls and empty lists from objects, recursively.
func stripEmpty(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if e == nil {
				delete(t, k)
				continue
			}
			if l, ok := e.([]any); ok && len(l) == 0 {
				delete(t, k)
				continue
			}
			t[k] = stripEmpty(e)
		}
		return t
	case []any:
		for i := range t {
			t[i] = stripEmpty(t[i])
		}
		return t
	default:
		return v
	}
}

// ApplyAPIDefaults applies the API defaulting the allocator relies on (spec §1.2, §5.1):
// allocationMode "" → ExactCount, ExactCount with count 0 → 1, toleration operator "" → Equal.
func ApplyAPIDefaults(claim *resourceapi.ResourceClaim) {
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		if e := r.Exactly; e != nil {
			if e.AllocationMode == "" {
				e.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			}
			if e.AllocationMode == resourceapi.DeviceAllocationModeExactCount && e.Count == 0 {
				e.Count = 1
			}
			defaultTolerations(e.Tolerations)
		}
		for j := range r.FirstAvailable {
			sub := &r.FirstAvailable[j]
			if sub.AllocationMode == "" {
				sub.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			}
			if sub.AllocationMode == resourceapi.DeviceAllocationModeExactCount && sub.Count == 0 {
				sub.Count = 1
			}
			defaultTolerations(sub.Tolerations)
		}
	}
}

func defaultTolerations(ts []resourceapi.DeviceToleration) {
	for i := range ts {
		if ts[i].Operator == "" {
			ts[i].Operator = resourceapi.DeviceTolerationOpEqual
		}
	}
}

// MarshalScenario writes a scenario as indented JSON (without `expect`).
func MarshalScenario(s *Scenario) ([]byte, error) {
	return marshalScenario(s, true)
}

// MarshalScenarioCompact writes a scenario as compact JSON (without `expect`).
func MarshalScenarioCompact(s *Scenario) ([]byte, error) {
	return marshalScenario(s, false)
}

func marshalScenario(s *Scenario, indent bool) ([]byte, error) {
	c := *s
	c.Expect = nil
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = "AllocationScenario"
	}
	if !indent {
		return json.Marshal(&c)
	}
	return json.MarshalIndent(&c, "", " ")
}
