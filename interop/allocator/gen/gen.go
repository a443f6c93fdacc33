// Package gen generates random, valid AllocationScenarios (spec structured-allocator.md §5.1) for
// the differential test between the upstream Go allocator and devicelet. Generation is seeded and
// deterministic: the same seed always yields the same scenario (no map iteration, one PCG stream).
//
// The scenarios cover nodes (1-20) with labels, node-local and network-attached pools (nodeSelector,
// allNodes, per-device node selection, multi-slice, incomplete and outdated pools), devices with
// string/int/bool/version attributes and capacities, partitionable devices consuming shared counters,
// taints, binding conditions, multi-allocatable devices with request policies, device classes with
// CEL selectors from a grammar of realistic expressions, claims with ExactCount/All, selectors,
// matchAttribute/distinctAttribute constraints, firstAvailable subrequests, admin access,
// tolerations, capacity requests and configuration, pre-allocated state, and mode: schedule.
// Sizes are bounded so that the exhaustive search of the allocator stays small.
package gen

import (
	"fmt"
	"math/rand/v2"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"devicelet.invalid/interop/allocator/harness"
)

// Config bounds the generated scenarios.
type Config struct {
	MaxNodes           int // default 20
	MaxDevicesPerSlice int // default 5
	MaxClaims          int // default 3
	MaxRequests        int // default 3 per claim
}

func (c Config) withDefaults() Config {
	if c.MaxNodes == 0 {
		c.MaxNodes = 20
	}
	if c.MaxDevicesPerSlice == 0 {
		c.MaxDevicesPerSlice = 5
	}
	if c.MaxClaims == 0 {
		c.MaxClaims = 3
	}
	if c.MaxRequests == 0 {
		c.MaxRequests = 3
	}
	return c
}

type driverInfo struct {
	name  string // e.g. gpu.example.com
	short string // e.g. gpu
}

var allDrivers = []driverInfo{
	{"gpu.example.com", "gpu"},
	{"nic.example.com", "nic"},
	{"fpga.example.com", "fpga"},
}

var (
	models   = []string{"A100", "H100", "L4", "T4", "MI300"}
	versions = []string{"1.0.0", "1.2.3", "1.2.3+build.7", "1.10.0", "2.0.0-rc.1", "2.1.0", "0.9.12"}
	regions  = []string{"region-a", "region-b", "region-c"}
	memories = []string{"8Gi", "16Gi", "40Gi", "80Gi", "1Ti", "1500Mi"}
)

type generator struct {
	rng      *rand.Rand
	cfg      Config
	s        *harness.Scenario
	drivers  []driverInfo
	cc       bool // ConsumableCapacity feature (and CEL option)
	pd       bool // PartitionableDevices
	devices  []devRef
	classes  []classInfo
	shareSeq int
}

// devRef remembers a generated device for pre-allocated state.
type devRef struct {
	driver, pool, name string
	multi              bool
	memory             *resource.Quantity
}

type classInfo struct {
	name   string
	driver string // "" = any driver
}

func (g *generator) intn(n int) int {
	if n <= 0 {
		return 0
	}
	return g.rng.IntN(n)
}
func (g *generator) chance(p float64) bool { return g.rng.Float64() < p }
func pick[T any](g *generator, list []T) T { return list[g.intn(len(list))] }

// Scenario returns the scenario for a seed.
func Scenario(seed uint64, cfg Config) *harness.Scenario {
	g := &generator{rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), cfg: cfg.withDefaults()}
	g.s = &harness.Scenario{
		APIVersion: harness.APIVersion,
		Kind:       "AllocationScenario",
		Name:       fmt.Sprintf("random-%d", seed),
		Semantics:  harness.Semantics{Variant: "incubating", Compat: "k8s-v1.36.1"},
		Mode:       "allocate",
	}
	g.features()
	g.nodes()
	g.drivers = append([]driverInfo(nil), allDrivers[:1+g.intn(len(allDrivers))]...)
	g.slices()
	g.deviceClasses()
	g.claims()
	g.allocatedState()
	if g.chance(0.15) {
		g.schedule()
	}
	return g.s
}

func (g *generator) features() {
	f := harness.AllIncubatingFeatures
	if g.chance(0.3) {
		f.AdminAccess = !g.chance(0.2)
		f.PrioritizedList = !g.chance(0.2)
		f.PartitionableDevices = !g.chance(0.25)
		f.DeviceTaints = !g.chance(0.25)
		f.DeviceBindingAndStatus = !g.chance(0.25)
		f.ConsumableCapacity = !g.chance(0.25)
	}
	g.s.Features = f
	g.cc = f.ConsumableCapacity
	g.pd = f.PartitionableDevices
	g.s.CEL = &harness.CELOptions{EnableConsumableCapacity: f.ConsumableCapacity}
	if g.chance(0.3) {
		g.s.CEL = nil // derived from features
	}
	if g.chance(0.1) {
		g.s.ApplyAPIDefaults = ptr.To(true)
	}
}

func (g *generator) nodes() {
	n := 1 + g.intn(g.cfg.MaxNodes)
	if g.chance(0.65) {
		n = 1 + g.intn(min(4, g.cfg.MaxNodes))
	}
	for i := 0; i < n; i++ {
		labels := map[string]string{"region": pick(g, regions), "kubernetes.io/hostname": fmt.Sprintf("node-%d", i)}
		if g.chance(0.5) {
			labels["example.com/accelerated"] = "true"
		}
		g.s.Nodes = append(g.s.Nodes, v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: labels}})
	}
}

// ---------------------------------------------------------------------------- slices

func (g *generator) slices() {
	poolSeq := 0
	for ni := range g.s.Nodes {
		node := g.s.Nodes[ni].Name
		for _, d := range g.drivers {
			if !g.chance(0.85) {
				continue
			}
			switch {
			case g.chance(0.15):
				g.partitionablePool(d, node, fmt.Sprintf("%s-%s", node, d.short), "node")
			case g.chance(0.1):
				g.multiSlicePool(d, fmt.Sprintf("%s-%s", node, d.short), func(s *resourceapi.ResourceSliceSpec) { s.NodeName = ptr.To(node) })
			default:
				g.simplePool(d, node, fmt.Sprintf("%s-%s", node, d.short), func(s *resourceapi.ResourceSliceSpec) { s.NodeName = ptr.To(node) })
			}
		}
	}
	// Network-attached pools.
	for i, n := 0, g.intn(3); i < n; i++ {
		d := pick(g, g.drivers)
		pool := fmt.Sprintf("net-%s-%d", d.short, poolSeq)
		poolSeq++
		switch g.intn(5) {
		case 0:
			g.simplePool(d, "", pool, func(s *resourceapi.ResourceSliceSpec) { s.AllNodes = ptr.To(true) })
		case 1:
			sel := g.nodeSelector()
			g.simplePool(d, "", pool, func(s *resourceapi.ResourceSliceSpec) { s.NodeSelector = sel })
		case 2:
			g.perDevicePool(d, pool)
		case 3:
			g.partitionablePool(d, "", pool, "all")
		default:
			sel := g.nodeSelector()
			g.multiSlicePool(d, pool, func(s *resourceapi.ResourceSliceSpec) { s.NodeSelector = sel.DeepCopy() })
		}
	}
	if len(g.drivers) > 1 && g.chance(0.12) {
		// Two drivers with a partitionable pool of the same name (spec §7 #23: Go keys its counter
		// caches by pool name only).
		g.partitionablePool(g.drivers[0], "", "shared-pool", "all")
		g.partitionablePool(g.drivers[1], "", "shared-pool", "all")
	}
	if len(g.s.Nodes) > 1 && g.chance(0.1) {
		// A pool whose slices live on two different nodes (multi-host pool).
		d := pick(g, g.drivers)
		n0, n1 := g.s.Nodes[0].Name, g.s.Nodes[1].Name
		for si, nn := range []string{n0, n1} {
			sl := g.newSlice(d, fmt.Sprintf("multihost-slice-%d", si), "multihost", 1, 2, func(s *resourceapi.ResourceSliceSpec) { s.NodeName = ptr.To(nn) })
			for i, n := 0, 1+g.intn(3); i < n; i++ {
				sl.Spec.Devices = append(sl.Spec.Devices, g.device(d, "multihost", fmt.Sprintf("s%d-dev-%d", si, i), true))
			}
			g.s.ResourceSlices = append(g.s.ResourceSlices, sl)
		}
	}
	if len(g.s.ResourceSlices) > 1 && g.chance(0.3) {
		// File order matters only for slices of the same pool; shuffle to exercise sorting.
		g.rng.Shuffle(len(g.s.ResourceSlices), func(i, j int) {
			g.s.ResourceSlices[i], g.s.ResourceSlices[j] = g.s.ResourceSlices[j], g.s.ResourceSlices[i]
		})
	}
}

func (g *generator) nodeSelector() *v1.NodeSelector {
	var term v1.NodeSelectorTerm
	switch g.intn(4) {
	case 0:
		// matchFields on metadata.name accepts exactly one value.
		term.MatchFields = []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{pick(g, g.s.Nodes).Name}}}
	case 1:
		term.MatchExpressions = []v1.NodeSelectorRequirement{{Key: "example.com/accelerated", Operator: v1.NodeSelectorOpExists}}
	case 2:
		term.MatchExpressions = []v1.NodeSelectorRequirement{{Key: "region", Operator: v1.NodeSelectorOpNotIn, Values: []string{pick(g, regions)}}}
	default:
		vals := []string{pick(g, regions)}
		if g.chance(0.5) {
			if r := pick(g, regions); r != vals[0] {
				vals = append(vals, r)
			}
		}
		term.MatchExpressions = []v1.NodeSelectorRequirement{{Key: "region", Operator: v1.NodeSelectorOpIn, Values: vals}}
	}
	return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{term}}
}

func (g *generator) newSlice(d driverInfo, name, pool string, gen int64, count int64, nodeSel func(*resourceapi.ResourceSliceSpec)) resourceapi.ResourceSlice {
	s := resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: d.name,
			Pool:   resourceapi.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: count},
		},
	}
	nodeSel(&s.Spec)
	return s
}

func (g *generator) simplePool(d driverInfo, node, pool string, nodeSel func(*resourceapi.ResourceSliceSpec)) {
	s := g.newSlice(d, pool+"-slice", pool, 1, 1, nodeSel)
	n := 1 + g.intn(g.cfg.MaxDevicesPerSlice)
	for i := 0; i < n; i++ {
		s.Spec.Devices = append(s.Spec.Devices, g.device(d, pool, fmt.Sprintf("dev-%d", i), true))
	}
	g.s.ResourceSlices = append(g.s.ResourceSlices, s)
}

// multiSlicePool: two or three slices; sometimes incomplete (a slice missing) or with an outdated
// slice of an older generation.
func (g *generator) multiSlicePool(d driverInfo, pool string, nodeSel func(*resourceapi.ResourceSliceSpec)) {
	count := int64(2 + g.intn(2))
	present := count
	if g.chance(0.2) {
		present-- // incomplete pool
	}
	gen := int64(2)
	for si := int64(0); si < present; si++ {
		s := g.newSlice(d, fmt.Sprintf("%s-slice-%d", pool, si), pool, gen, count, nodeSel)
		for i, n := 0, 1+g.intn(3); i < n; i++ {
			s.Spec.Devices = append(s.Spec.Devices, g.device(d, pool, fmt.Sprintf("s%d-dev-%d", si, i), true))
		}
		g.s.ResourceSlices = append(g.s.ResourceSlices, s)
	}
	if g.chance(0.3) {
		// An outdated slice of an older generation, ignored by the allocator.
		s := g.newSlice(d, pool+"-slice-old", pool, gen-1, count, nodeSel)
		s.Spec.Devices = []resourceapi.Device{g.device(d, pool, "old-dev", false)}
		g.s.ResourceSlices = append(g.s.ResourceSlices, s)
	}
	if g.chance(0.12) {
		// Duplicate device name within the pool: an invalid pool.
		s := g.newSlice(d, pool+"-slice-dup", pool, gen, count, nodeSel)
		s.Spec.Devices = []resourceapi.Device{g.device(d, pool, "s0-dev-0", false)}
		g.s.ResourceSlices = append(g.s.ResourceSlices, s)
	}
}

func (g *generator) perDevicePool(d driverInfo, pool string) {
	s := g.newSlice(d, pool+"-slice", pool, 1, 1, func(s *resourceapi.ResourceSliceSpec) { s.PerDeviceNodeSelection = ptr.To(true) })
	for i, n := 0, 1+g.intn(g.cfg.MaxDevicesPerSlice); i < n; i++ {
		dev := g.device(d, pool, fmt.Sprintf("dev-%d", i), true)
		switch g.intn(3) {
		case 0:
			dev.NodeName = ptr.To(pick(g, g.s.Nodes).Name)
		case 1:
			dev.AllNodes = ptr.To(true)
		default:
			dev.NodeSelector = g.nodeSelector()
		}
		s.Spec.Devices = append(s.Spec.Devices, dev)
	}
	g.s.ResourceSlices = append(g.s.ResourceSlices, s)
}

// partitionablePool: a counter slice plus a device slice whose devices (a whole device and its
// partitions) consume the shared counters.
func (g *generator) partitionablePool(d driverInfo, node, pool, where string) {
	nodeSel := func(s *resourceapi.ResourceSliceSpec) {
		if where == "node" {
			s.NodeName = ptr.To(node)
		} else {
			s.AllNodes = ptr.To(true)
		}
	}
	sets := 1 + g.intn(2)
	prefix := pool
	if pool == "shared-pool" {
		prefix = d.short + "-" + pool
	}
	counters := g.newSlice(d, prefix+"-counters", pool, 1, 2, nodeSel)
	for cs := 0; cs < sets; cs++ {
		counters.Spec.SharedCounters = append(counters.Spec.SharedCounters, resourceapi.CounterSet{
			Name: fmt.Sprintf("unit-%d", cs),
			Counters: map[string]resourceapi.Counter{
				"memory": {Value: resource.MustParse("80Gi")},
				"slices": {Value: resource.MustParse(fmt.Sprint(4 + g.intn(4)))},
			},
		})
	}
	devs := g.newSlice(d, prefix+"-devices", pool, 1, 2, nodeSel)
	for cs := 0; cs < sets; cs++ {
		// The whole unit, then partitions of 1/2 and 1/4.
		shapes := []struct {
			name   string
			memory string
			slices int
		}{{"whole", "80Gi", 7}, {"half-0", "40Gi", 3}, {"half-1", "40Gi", 3}, {"quarter-0", "20Gi", 1}, {"quarter-1", "20Gi", 2}}
		for _, sh := range shapes {
			if !g.chance(0.75) {
				continue
			}
			dev := g.device(d, pool, fmt.Sprintf("u%d-%s", cs, sh.name), g.chance(0.3))
			dev.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{
				CounterSet: fmt.Sprintf("unit-%d", cs),
				Counters: map[string]resourceapi.Counter{
					"memory": {Value: resource.MustParse(sh.memory)},
					"slices": {Value: resource.MustParse(fmt.Sprint(sh.slices))},
				},
			}}
			if dev.Capacity == nil {
				dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
			}
			dev.Capacity["memory"] = resourceapi.DeviceCapacity{Value: resource.MustParse(sh.memory)}
			devs.Spec.Devices = append(devs.Spec.Devices, dev)
		}
	}
	if len(devs.Spec.Devices) == 0 {
		dev := g.device(d, pool, "u0-whole", false)
		dev.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "unit-0", Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("80Gi")}}}}
		devs.Spec.Devices = append(devs.Spec.Devices, dev)
	}
	if g.chance(0.5) {
		g.s.ResourceSlices = append(g.s.ResourceSlices, counters, devs)
	} else {
		g.s.ResourceSlices = append(g.s.ResourceSlices, devs, counters)
	}
}

// device builds one device with a random subset of attributes and capacities. extras enables
// taints, binding conditions and multi-allocation.
func (g *generator) device(d driverInfo, pool, name string, extras bool) resourceapi.Device {
	dev := resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}
	dev.Attributes["model"] = resourceapi.DeviceAttribute{StringValue: ptr.To(pick(g, models))}
	if g.chance(0.9) {
		dev.Attributes["numa"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.intn(4)))}
	}
	if g.chance(0.7) {
		dev.Attributes["healthy"] = resourceapi.DeviceAttribute{BoolValue: ptr.To(g.chance(0.8))}
	}
	if g.chance(0.85) {
		dev.Attributes["driverVersion"] = resourceapi.DeviceAttribute{VersionValue: ptr.To(pick(g, versions))}
	}
	if g.chance(0.5) {
		dev.Attributes["example.com/family"] = resourceapi.DeviceAttribute{StringValue: ptr.To(pick(g, []string{"GPU", "NIC", "Accel"}))}
	}
	if g.chance(0.4) {
		dev.Attributes[resourceapi.QualifiedName(d.name+"/pcieRoot")] = resourceapi.DeviceAttribute{StringValue: ptr.To(fmt.Sprintf("pci%04x:%02x", g.intn(2), g.intn(3)))}
	}
	if g.chance(0.8) {
		dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(pick(g, memories))}}
		if g.chance(0.5) {
			dev.Capacity["cores"] = resourceapi.DeviceCapacity{Value: resource.MustParse(fmt.Sprint(4 * (1 + g.intn(8))))}
		}
	}
	multi := false
	if extras {
		if g.chance(0.1) {
			dev.Taints = []resourceapi.DeviceTaint{{
				Key:    pick(g, []string{"example.com/unhealthy", "example.com/maintenance"}),
				Value:  pick(g, []string{"", "true", "soon"}),
				Effect: pick(g, []resourceapi.DeviceTaintEffect{resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNone}),
			}}
		}
		if g.chance(0.06) {
			dev.BindingConditions = []string{"example.com/attached"}
			dev.BindingFailureConditions = []string{"example.com/failed"}
			if g.chance(0.5) {
				dev.BindsToNode = ptr.To(true)
			}
		}
		if g.chance(0.12) {
			multi = true
			dev.AllowMultipleAllocations = ptr.To(true)
			mem := resource.MustParse(pick(g, []string{"40Gi", "80Gi"}))
			policy := &resourceapi.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("1Gi"))}
			switch g.intn(6) {
			case 0:
				policy.ValidRange = &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Gi")), Step: ptr.To(resource.MustParse(pick(g, []string{"1Gi", "2Gi"})))}
			case 1:
				policy.ValidValues = []resource.Quantity{resource.MustParse("1Gi"), resource.MustParse("10Gi"), resource.MustParse("20Gi")}
			case 2:
				policy.ValidRange = &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Gi")), Max: ptr.To(mem.DeepCopy())}
			case 3:
				policy = nil // unrequested capacity consumes the full value (spec §7 #33)
			case 4:
				// Fractional step: rounding uses Quantity.Value() (spec §7 #34).
				policy = &resourceapi.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("1")), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("500m")), Step: ptr.To(resource.MustParse("500m"))}}
			default:
				policy.ValidRange = &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Gi"))}
			}
			if g.chance(0.15) {
				dev.Capacity = nil // multi-allocatable without capacities (spec §7 #26)
			} else {
				if dev.Capacity == nil {
					dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
				}
				if policy != nil && policy.Default.Value() == 1 {
					dev.Capacity["cores"] = resourceapi.DeviceCapacity{Value: resource.MustParse("8"), RequestPolicy: policy}
				} else {
					dev.Capacity["memory"] = resourceapi.DeviceCapacity{Value: mem, RequestPolicy: policy}
				}
			}
		}
	}
	var memQ *resource.Quantity
	if c, ok := dev.Capacity["memory"]; ok {
		memQ = ptr.To(c.Value.DeepCopy())
	}
	g.devices = append(g.devices, devRef{driver: d.name, pool: pool, name: name, multi: multi, memory: memQ})
	return dev
}

// ---------------------------------------------------------------------------- CEL grammar

// attrExpr returns an expression reading a device attribute of the driver's domain.
func attr(domain, name string) string {
	return fmt.Sprintf("device.attributes[%q].%s", domain, name)
}

// guarded wraps an expression on an attribute that not every device has in has(); unguarded
// accesses to missing attributes are kept at a low rate (they are fatal CEL runtime errors).
func (g *generator) guarded(domain, name, expr string) string {
	if g.chance(0.93) {
		return fmt.Sprintf("(has(%s) && %s)", attr(domain, name), expr)
	}
	return expr
}

// celAtom returns one clause for a driver's devices.
func (g *generator) celAtom(d driverInfo) string {
	dom := d.name
	switch g.intn(16) {
	case 0:
		return fmt.Sprintf("device.driver == %q", d.name)
	case 1:
		return fmt.Sprintf("%s == %q", attr(dom, "model"), pick(g, models))
	case 2:
		return fmt.Sprintf("%s in [%q, %q]", attr(dom, "model"), pick(g, models), pick(g, models))
	case 3:
		return g.guarded(dom, "numa", fmt.Sprintf("%s %s %d", attr(dom, "numa"), pick(g, []string{">=", "<", "==", "!="}), g.intn(4)))
	case 4:
		return g.guarded(dom, "healthy", attr(dom, "healthy"))
	case 5:
		return fmt.Sprintf("has(%s)", attr(dom, pick(g, []string{"healthy", "numa", "driverVersion"})))
	case 6:
		return g.guarded(dom, "driverVersion", fmt.Sprintf("%s.isGreaterThan(semver(%q))", attr(dom, "driverVersion"), pick(g, versions)))
	case 7:
		return g.guarded(dom, "driverVersion", fmt.Sprintf("%s.compareTo(semver(%q)) %s 0", attr(dom, "driverVersion"), pick(g, versions), pick(g, []string{"<=", ">=", "=="})))
	case 8:
		return g.guarded(dom, "driverVersion", fmt.Sprintf("%s.major() %s %d", attr(dom, "driverVersion"), pick(g, []string{">=", "<"}), 1+g.intn(2)))
	case 9:
		cap := fmt.Sprintf("device.capacity[%q].memory", dom)
		return fmt.Sprintf("(has(%s) && %s.compareTo(quantity(%q)) %s 0)", cap, cap, pick(g, memories), pick(g, []string{">=", "<", "<="}))
	case 10:
		cap := fmt.Sprintf("device.capacity[%q].memory", dom)
		return fmt.Sprintf("(has(%s) && %s.isGreaterThan(quantity(%q)))", cap, cap, pick(g, []string{"10Gi", "32Gi", "500Mi"}))
	case 11:
		return fmt.Sprintf("%s.startsWith(%q)", attr(dom, "model"), pick(g, []string{"A", "H", "L", "MI"}))
	case 12:
		return fmt.Sprintf("%s.lowerAscii() %s %q", attr(dom, "model"), pick(g, []string{"==", "!="}), strings.ToLower(pick(g, models)))
	case 13:
		return fmt.Sprintf("%s.matches(%q)", attr(dom, "model"), pick(g, []string{"^[AH]100$", "^(L|T)4$", "[0-9]+"}))
	case 14:
		if g.chance(0.3) {
			// An unknown domain is an empty map (spec §7 #41).
			return fmt.Sprintf("!has(%s)", attr("unknown.example.com", "family"))
		}
		return fmt.Sprintf("(%q in device.attributes && %s == %q)", "example.com", attr("example.com", "family"), pick(g, []string{"GPU", "NIC", "Accel"}))
	default:
		if g.cc && g.chance(0.5) {
			return pick(g, []string{"device.allowMultipleAllocations", "!device.allowMultipleAllocations"})
		}
		return fmt.Sprintf("size(%s) %s %d", attr(dom, "model"), pick(g, []string{">", "<=", "=="}), 2+g.intn(3))
	}
}

// celExpr combines 1-3 atoms; a small fraction is malformed (compile error).
func (g *generator) celExpr(d driverInfo) string {
	if g.chance(0.01) {
		return pick(g, []string{"device.attributes[", "noSuchVariable == 1", `device.driver == 1`})
	}
	e := g.celAtom(d)
	for i, n := 0, g.intn(3); i < n; i++ {
		op := pick(g, []string{"&&", "&&", "||"})
		next := g.celAtom(d)
		if g.chance(0.1) {
			next = "!(" + next + ")"
		}
		e = fmt.Sprintf("%s %s %s", e, op, next)
	}
	return e
}

func (g *generator) deviceClasses() {
	for _, d := range g.drivers {
		name := d.short + "-class"
		g.s.DeviceClasses = append(g.s.DeviceClasses, resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{
				{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", d.name)}},
			}},
		})
		g.classes = append(g.classes, classInfo{name: name, driver: d.name})
		if g.chance(0.6) {
			name := d.short + "-fancy"
			sels := []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", d.name)}}}
			for i, n := 0, 1+g.intn(2); i < n; i++ {
				sels = append(sels, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: g.celExpr(d)}})
			}
			class := resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{Selectors: sels}}
			if g.chance(0.4) {
				class.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: g.opaque(d.name, "class")}}
			}
			g.s.DeviceClasses = append(g.s.DeviceClasses, class)
			g.classes = append(g.classes, classInfo{name: name, driver: d.name})
		}
	}
	if g.chance(0.2) {
		g.s.DeviceClasses = append(g.s.DeviceClasses, resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "any-class"}})
		g.classes = append(g.classes, classInfo{name: "any-class"})
	}
}

func (g *generator) opaque(driver, source string) resourceapi.DeviceConfiguration {
	return resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver:     driver,
		Parameters: runtime.RawExtension{Raw: []byte(fmt.Sprintf(`{"source":%q,"value":%d}`, source, g.intn(100)))},
	}}
}

// ---------------------------------------------------------------------------- claims

func (g *generator) tolerations() []resourceapi.DeviceToleration {
	if !g.chance(0.25) {
		return nil
	}
	if g.chance(0.4) {
		return []resourceapi.DeviceToleration{{Operator: resourceapi.DeviceTolerationOpExists}}
	}
	t := resourceapi.DeviceToleration{Key: pick(g, []string{"example.com/unhealthy", "example.com/maintenance"})}
	if g.chance(0.5) {
		t.Operator = resourceapi.DeviceTolerationOpExists
	} else {
		if g.chance(0.8) {
			t.Operator = resourceapi.DeviceTolerationOpEqual
		}
		t.Value = pick(g, []string{"", "true", "soon"})
	}
	if g.chance(0.4) {
		t.Effect = pick(g, []resourceapi.DeviceTaintEffect{resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute})
		if t.Effect == resourceapi.DeviceTaintEffectNoExecute && g.chance(0.3) {
			t.TolerationSeconds = ptr.To(int64(60)) // ignored by the allocator (spec §7 #37)
		}
	}
	return []resourceapi.DeviceToleration{t}
}

func (g *generator) capacityRequest() *resourceapi.CapacityRequirements {
	if !g.cc || !g.chance(0.2) {
		return nil
	}
	if g.chance(0.2) {
		return &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"cores": resource.MustParse(pick(g, []string{"1", "2", "1500m", "700m"})),
		}}
	}
	return &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		"memory": resource.MustParse(pick(g, []string{"1Gi", "5Gi", "10Gi", "20Gi", "1500Mi"})),
	}}
}

func (g *generator) requestSelectors(class classInfo) []resourceapi.DeviceSelector {
	if !g.chance(0.25) {
		return nil
	}
	d := pick(g, g.drivers)
	for _, di := range g.drivers {
		if di.name == class.driver {
			d = di
		}
	}
	var sels []resourceapi.DeviceSelector
	for i, n := 0, 1+g.intn(2); i < n; i++ {
		sels = append(sels, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: g.celExpr(d)}})
	}
	return sels
}

func (g *generator) count(budget *int) (resourceapi.DeviceAllocationMode, int64) {
	if g.chance(0.1) {
		return resourceapi.DeviceAllocationModeAll, 0
	}
	c := 1
	if *budget > 1 && g.chance(0.35) {
		c = 2 + g.intn(min(2, *budget-1))
	}
	*budget -= c
	if g.s.ApplyAPIDefaults != nil && c == 1 && g.chance(0.5) {
		return "", 0 // defaulted to ExactCount / 1
	}
	return resourceapi.DeviceAllocationModeExactCount, int64(c)
}

func (g *generator) claims() {
	n := 1 + g.intn(g.cfg.MaxClaims)
	budget := 6 // total devices asked for across all claims, to bound the search
	for ci := 0; ci < n; ci++ {
		claim := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("claim-%d", ci)}}
		var reqNames []string // request names (and req/sub for subrequests) for constraints
		var baseNames []string
		rn := 1
		if g.chance(0.4) {
			rn = 1 + g.intn(g.cfg.MaxRequests)
		}
		for ri := 0; ri < rn && budget > 0; ri++ {
			req := resourceapi.DeviceRequest{Name: fmt.Sprintf("req-%d", ri)}
			baseNames = append(baseNames, req.Name)
			if g.chance(0.2) {
				for si, sn := 0, 2+g.intn(2); si < sn; si++ {
					class := pick(g, g.classes)
					mode, cnt := g.count(&budget)
					sub := resourceapi.DeviceSubRequest{
						Name: fmt.Sprintf("sub-%d", si), DeviceClassName: class.name, AllocationMode: mode, Count: cnt,
						Selectors: g.requestSelectors(class), Tolerations: g.tolerations(), Capacity: g.capacityRequest(),
					}
					req.FirstAvailable = append(req.FirstAvailable, sub)
					reqNames = append(reqNames, req.Name+"/"+sub.Name)
				}
			} else {
				class := pick(g, g.classes)
				if g.chance(0.01) {
					class = classInfo{name: "missing-class"}
				}
				mode, cnt := g.count(&budget)
				ex := &resourceapi.ExactDeviceRequest{
					DeviceClassName: class.name, AllocationMode: mode, Count: cnt,
					Selectors: g.requestSelectors(class), Tolerations: g.tolerations(), Capacity: g.capacityRequest(),
				}
				if g.chance(0.06) {
					ex.AdminAccess = ptr.To(true)
				} else if g.chance(0.02) {
					ex.AdminAccess = ptr.To(false) // an error with AdminAccess off (spec §7 #9)
				}
				req.Exactly = ex
				reqNames = append(reqNames, req.Name)
			}
			claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, req)
		}
		if len(claim.Spec.Devices.Requests) == 0 {
			claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "req-0", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: pick(g, g.classes).name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			}}}
			baseNames = []string{"req-0"}
			reqNames = []string{"req-0"}
		}
		if g.chance(0.3) {
			c := resourceapi.DeviceConstraint{}
			if g.chance(0.5) {
				for _, r := range pickSome(g, baseNames, reqNames) {
					c.Requests = append(c.Requests, r)
				}
			}
			name := pick(g, []resourceapi.FullyQualifiedName{"gpu.example.com/model", "gpu.example.com/numa", "nic.example.com/numa", "example.com/family", "gpu.example.com/driverVersion", "gpu.example.com/pcieRoot"})
			if g.cc && g.chance(0.4) {
				c.DistinctAttribute = &name
			} else {
				c.MatchAttribute = &name
			}
			claim.Spec.Devices.Constraints = append(claim.Spec.Devices.Constraints, c)
		}
		if g.chance(0.2) {
			cfg := resourceapi.DeviceClaimConfiguration{DeviceConfiguration: g.opaque(pick(g, g.drivers).name, "claim")}
			if g.chance(0.5) {
				cfg.Requests = pickSome(g, baseNames, reqNames)
			}
			claim.Spec.Devices.Config = append(claim.Spec.Devices.Config, cfg)
		}
		g.s.Claims = append(g.s.Claims, claim)
	}
	if len(g.s.Claims) > 1 && g.chance(0.03) {
		g.s.Claims = append(g.s.Claims, *g.s.Claims[0].DeepCopy()) // the same claim twice
	}
}

// pickSome picks a non-empty subset of request references (base names or req/sub names).
func pickSome(g *generator, base, full []string) []string {
	src := base
	if g.chance(0.3) {
		src = full
	}
	var out []string
	for _, r := range src {
		if g.chance(0.6) {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		out = []string{src[0]}
	}
	return out
}

// ---------------------------------------------------------------------------- state

func (g *generator) allocatedState() {
	if len(g.devices) == 0 || !g.chance(0.5) {
		return
	}
	st := &harness.State{}
	frac := pick(g, []float64{0.1, 0.3, 0.6})
	var claimResults []resourceapi.DeviceRequestAllocationResult
	for _, d := range g.devices {
		if !g.chance(frac) {
			continue
		}
		switch {
		case d.multi && g.cc:
			g.shareSeq++
			share := fmt.Sprintf("00000000-0000-4000-8000-%012d", g.shareSeq)
			used := "10Gi"
			if g.chance(0.5) {
				st.SharedDevices = append(st.SharedDevices, harness.StateShare{Driver: d.driver, Pool: d.pool, Device: d.name, ShareID: share})
				st.ConsumedCapacity = append(st.ConsumedCapacity, harness.StateCapacity{Driver: d.driver, Pool: d.pool, Device: d.name, Capacity: map[string]string{"memory": used}})
			} else {
				uid := types.UID(share)
				claimResults = append(claimResults, resourceapi.DeviceRequestAllocationResult{
					Request: "r", Driver: d.driver, Pool: d.pool, Device: d.name, ShareID: &uid,
					ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(used)},
				})
			}
		case g.chance(0.5):
			st.Devices = append(st.Devices, harness.StateDevice{Driver: d.driver, Pool: d.pool, Device: d.name})
		default:
			r := resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: d.driver, Pool: d.pool, Device: d.name}
			if g.chance(0.15) {
				r.AdminAccess = ptr.To(true) // skipped when building the state
			}
			claimResults = append(claimResults, r)
		}
	}
	g.s.Allocated = &harness.Allocated{}
	if len(st.Devices)+len(st.SharedDevices)+len(st.ConsumedCapacity) > 0 {
		g.s.Allocated.State = st
	}
	if len(claimResults) > 0 {
		g.s.Allocated.Claims = []resourceapi.ResourceClaim{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "allocated-0"},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
				Devices: resourceapi.DeviceAllocationResult{Results: claimResults},
			}},
		}}
	}
}

// schedule turns the scenario into mode: schedule: pods use one or two claims each, and some pods
// share a claim.
func (g *generator) schedule() {
	g.s.Mode = "schedule"
	g.s.FirstFit = g.chance(0.3)
	for pi, n := 0, 2+g.intn(4); pi < n; pi++ {
		pod := harness.Pod{Name: fmt.Sprintf("pod-%d", pi)}
		pod.Claims = append(pod.Claims, pick(g, g.s.Claims).Name)
		if g.chance(0.3) {
			if c := pick(g, g.s.Claims).Name; c != pod.Claims[0] {
				pod.Claims = append(pod.Claims, c)
			}
		}
		g.s.Pods = append(g.s.Pods, pod)
	}
}
