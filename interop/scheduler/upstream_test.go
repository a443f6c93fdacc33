package scheduler

// The upstream half: kube-scheduler v1.36.3's own framework and in-tree plugins answer each case
// the way one scheduling cycle would (pkg/scheduler/schedule_one.go schedulePod,
// findNodesThatFitPod, findNodesThatPassFilters, prioritizeNodes, and DefaultPreemption's dry
// run, pkg/scheduler/framework/preemption DryRunPreemption), except that it looks at every node
// (no percentageOfNodesToScore cut, no early stop), scores even a single feasible node, and asks
// every node where preemption might help for its victims instead of picking one.

import (
	"context"
	"fmt"
	"runtime/debug"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	resourceslicetracker "k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkplugins "k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultpreemption"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodevolumelimits"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"
)

// Result is one case's answer, in `devicelet schedule -o json`'s format.
type Result struct {
	Name       string       `json:"name"`
	Error      string       `json:"error,omitempty"`
	PreFilter  *Status      `json:"preFilter"`
	Nodes      []NodeResult `json:"nodes"`
	Preemption *Preemption  `json:"preemption"`
}

// Status is a rejection: the plugin that gave it (empty for the nodes a PreFilterResult left
// out, as upstream), its code and its reasons.
type Status struct {
	Plugin  string   `json:"plugin"`
	Code    string   `json:"code"`
	Reasons []string `json:"reasons"`
}

// NodeResult is one node: rejected, or feasible with its weighted scores.
type NodeResult struct {
	Name      string           `json:"name"`
	Rejection *Status          `json:"rejection"`
	Scores    map[string]int64 `json:"scores,omitempty"`
	Total     int64            `json:"total"`
}

// Preemption is DefaultPreemption's dry run on every node where it might help.
type Preemption struct {
	Nodes map[string]PreemptionNode `json:"nodes"`
}

// PreemptionNode is SelectVictimsOnNode's answer: the victims (namespace/name) and how many of
// them violate a PDB, or why the node cannot be freed.
type PreemptionNode struct {
	Victims       []string `json:"victims,omitempty"`
	PDBViolations int      `json:"pdbViolations"`
	Failure       string   `json:"failure,omitempty"`
}

func toStatus(s *fwk.Status) *Status {
	if s.IsSuccess() {
		return nil
	}
	return &Status{Plugin: s.Plugin(), Code: s.Code().String(), Reasons: append([]string{}, s.Reasons()...)}
}

// buildProfile reads the case's config as kube-scheduler reads --config (the scheme's
// UniversalDecoder: defaulting, then conversion to the internal type), or takes the defaults,
// validates it as kube-scheduler does, and returns its one profile.
func buildProfile(raw []byte) (*config.KubeSchedulerProfile, error) {
	var cfg *config.KubeSchedulerConfiguration
	if len(raw) == 0 || string(raw) == "null" {
		var err error
		if cfg, err = latest.Default(); err != nil {
			return nil, err
		}
	} else {
		obj, gvk, err := scheme.Codecs.UniversalDecoder().Decode(raw, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decoding config: %w", err)
		}
		var ok bool
		if cfg, ok = obj.(*config.KubeSchedulerConfiguration); !ok {
			return nil, fmt.Errorf("config is a %s, not a KubeSchedulerConfiguration", gvk)
		}
	}
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if len(cfg.Profiles) != 1 {
		return nil, fmt.Errorf("config has %d profiles, want 1", len(cfg.Profiles))
	}
	return &cfg.Profiles[0], nil
}

// noNominatedPods is the pod nominator of a cluster where no pod waits for a preempted node
// (RunFilterPluginsWithNominatedPods asks it on every call).
type noNominatedPods struct{}

func (noNominatedPods) AddNominatedPod(klog.Logger, fwk.PodInfo, *fwk.NominatingInfo) {}
func (noNominatedPods) DeleteNominatedPodIfExists(*v1.Pod)                            {}
func (noNominatedPods) UpdateNominatedPod(klog.Logger, *v1.Pod, fwk.PodInfo)          {}
func (noNominatedPods) NominatedPodsForNode(string) []fwk.PodInfo                     { return nil }

// informerFactory holds the case's API objects in the listers the plugins read (namespaces
// for namespaceSelector, PDBs, the owners and services of default spreading, DeviceClasses and
// ResourceSlices for DynamicResources). The informers are never started: their stores are
// filled directly, which is all a lister reads. The claims are in their store too, but the
// DRA manager reads them from its assume cache, which learns them from informer events
// (primedInformer).
func informerFactory(c *Case) (informers.SharedInformerFactory, *fake.Clientset, error) {
	client := fake.NewClientset()
	f := informers.NewSharedInformerFactory(client, 0)
	stores := []struct {
		store cache.Store
		objs  []any
	}{
		{f.Core().V1().Namespaces().Informer().GetStore(), anySlice(c.Namespaces)},
		{f.Core().V1().Nodes().Informer().GetStore(), anySlice(c.Nodes)},
		{f.Core().V1().Pods().Informer().GetStore(), append(anySlice(c.Pods), c.Pod)},
		{f.Policy().V1().PodDisruptionBudgets().Informer().GetStore(), anySlice(c.PDBs)},
		{f.Core().V1().Services().Informer().GetStore(), anySlice(c.Services)},
		{f.Apps().V1().ReplicaSets().Informer().GetStore(), anySlice(c.ReplicaSets)},
		{f.Apps().V1().StatefulSets().Informer().GetStore(), anySlice(c.StatefulSets)},
		{f.Core().V1().ReplicationControllers().Informer().GetStore(), anySlice(c.ReplicationControllers)},
		{f.Resource().V1().DeviceClasses().Informer().GetStore(), anySlice(c.DeviceClasses)},
		{f.Resource().V1().ResourceSlices().Informer().GetStore(), anySlice(c.ResourceSlices)},
		{f.Resource().V1().ResourceClaims().Informer().GetStore(), anySlice(c.ResourceClaims)},
	}
	for _, s := range stores {
		for _, o := range s.objs {
			if err := s.store.Add(o); err != nil {
				return nil, nil, err
			}
		}
	}
	return f, client, nil
}

// primedInformer is the claims' informer as the assume cache sees it once the informer has
// listed: every handler added gets each claim as an add event of the initial list (the
// shared informer's contract), so the assume cache holds the claims and the DRA manager's
// allocated-devices tracker, which the assume cache feeds, knows the devices the allocated
// ones hold.
type primedInformer struct {
	cache.SharedIndexInformer
	objs []any
}

func (p primedInformer) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	reg, err := p.SharedIndexInformer.AddEventHandler(h)
	if err != nil {
		return nil, err
	}
	for _, o := range p.objs {
		h.OnAdd(o, true)
	}
	return reg, nil
}

func anySlice[T any](xs []T) []any {
	out := make([]any, 0, len(xs))
	for _, x := range xs {
		out = append(out, x)
	}
	return out
}

// runUpstream answers one case with kube-scheduler's code.
func runUpstream(c *Case) (res Result) {
	res.Name = c.Name
	defer func() {
		if p := recover(); p != nil {
			res = Result{Name: c.Name, Error: fmt.Sprintf("upstream panicked: %v\n%s", p, debug.Stack())}
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	profile, err := buildProfile(c.Config)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	factory, client, err := informerFactory(c)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	pod := c.Pod.DeepCopy()
	snapshot := internalcache.NewSnapshot(c.Pods, c.Nodes)
	// The DRA manager kube-scheduler builds (scheduler.New), over the same never-started
	// informers: the tracker without DeviceTaintRules (off by default in 1.36) lists the
	// slices from the store, the classes come from their lister, and the claims from the
	// assume cache, primed with them. No class names an extended resource, so NodeResourcesFit
	// and BalancedAllocation find none backed by DRA.
	claimInformer := primedInformer{factory.Resource().V1().ResourceClaims().Informer(), anySlice(c.ResourceClaims)}
	claims := assumecache.NewAssumeCache(klog.FromContext(ctx), claimInformer, "ResourceClaim", "", nil)
	slices, err := resourceslicetracker.StartTracker(ctx, resourceslicetracker.Options{
		EnableDeviceTaintRules:   utilfeature.DefaultFeatureGate.Enabled(features.DRADeviceTaintRules),
		EnableConsumableCapacity: utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
		SliceInformer:            factory.Resource().V1().ResourceSlices(),
		KubeClient:               client,
	})
	if err != nil {
		res.Error = err.Error()
		return res
	}
	draManager := dynamicresources.NewDRAManager(ctx, claims, slices, factory)

	// The in-tree registry, with DefaultPreemption's factory wrapped to keep the instance the
	// framework builds (with the profile's DefaultPreemptionArgs): its SelectVictimsOnNode is
	// what the dry run calls on each candidate node.
	registry := frameworkplugins.NewInTreeRegistry()
	var preemptor *defaultpreemption.DefaultPreemption
	newPreemption := registry[names.DefaultPreemption]
	registry[names.DefaultPreemption] = func(ctx context.Context, args runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		p, err := newPreemption(ctx, args, h)
		if err == nil {
			preemptor, _ = p.(*defaultpreemption.DefaultPreemption)
		}
		return p, err
	}
	schedFwk, err := frameworkruntime.NewFramework(ctx, registry, profile,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithSnapshotSharedLister(snapshot),
		frameworkruntime.WithPodNominator(noNominatedPods{}),
		frameworkruntime.WithSharedDRAManager(draManager),
		frameworkruntime.WithSharedCSIManager(nodevolumelimits.NewCSIManager(factory.Storage().V1().CSINodes().Lister())),
		frameworkruntime.WithEventRecorder(events.NewFakeRecorder(100)),
		frameworkruntime.WithParallelism(1),
	)
	if err != nil {
		res.Error = fmt.Sprintf("building the framework: %v", err)
		return res
	}
	defer func() { _ = schedFwk.Close() }()

	// findNodesThatFitPod: PreFilter first.
	state := framework.NewCycleState()
	allNodes, err := snapshot.NodeInfos().List()
	if err != nil {
		res.Error = err.Error()
		return res
	}
	statuses := framework.NewDefaultNodeToStatus()
	var feasible []fwk.NodeInfo
	preRes, s, unscheduledPlugins := schedFwk.RunPreFilterPlugins(ctx, state, pod)
	if !s.IsSuccess() {
		if !s.IsRejected() {
			res.Error = fmt.Sprintf("PreFilter: %v", s.AsError())
			return res
		}
		// Every node gets the PreFilter status (findNodesThatFitPod: SetAbsentNodesStatus).
		res.PreFilter = toStatus(s)
		statuses.SetAbsentNodesStatus(s)
	} else {
		nodes := allNodes
		if !preRes.AllNodes() {
			// The nodes a PreFilterResult leaves out are UnschedulableAndUnresolvable, without
			// a plugin, with schedule_one.go's message.
			nodes = nil
			for _, n := range allNodes {
				if preRes.NodeNames.Has(n.Node().Name) {
					nodes = append(nodes, n)
				}
			}
			statuses.SetAbsentNodesStatus(fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
				fmt.Sprintf("node(s) didn't satisfy plugin(s) %v", sets.List(unscheduledPlugins))))
		}
		// findNodesThatPassFilters, every node, one at a time.
		for _, n := range nodes {
			st := schedFwk.RunFilterPluginsWithNominatedPods(ctx, state, pod, n)
			switch {
			case st.Code() == fwk.Error:
				res.Error = fmt.Sprintf("Filter on %s: %v", n.Node().Name, st.AsError())
				return res
			case st.IsSuccess():
				feasible = append(feasible, n)
			default:
				statuses.Set(n.Node().Name, st)
			}
		}
	}

	// prioritizeNodes on the feasible nodes.
	scores := map[string]fwk.NodePluginScores{}
	if len(feasible) > 0 {
		if st := schedFwk.RunPreScorePlugins(ctx, state, pod, feasible); !st.IsSuccess() {
			res.Error = fmt.Sprintf("PreScore: %v", st.AsError())
			return res
		}
		list, st := schedFwk.RunScorePlugins(ctx, state, pod, feasible)
		if !st.IsSuccess() {
			res.Error = fmt.Sprintf("Score: %v", st.AsError())
			return res
		}
		for _, ns := range list {
			scores[ns.Name] = ns
		}
	}
	for _, n := range c.Nodes {
		nr := NodeResult{Name: n.Name}
		if ns, ok := scores[n.Name]; ok {
			nr.Scores = map[string]int64{}
			for _, ps := range ns.Scores {
				nr.Scores[ps.Name] = ps.Score
			}
			nr.Total = ns.TotalScore
		} else {
			nr.Rejection = toStatus(statuses.Get(n.Name))
		}
		res.Nodes = append(res.Nodes, nr)
	}

	// No feasible node: PostFilter, i.e. DefaultPreemption, if the profile has it and the pod
	// may preempt (Evaluator.Preempt: PodEligibleToPreemptOthers, then the nodes whose status
	// is Unschedulable, each dry run on a copy of the node and of the cycle state).
	if len(feasible) > 0 || preemptor == nil || !schedFwk.HasPostFilterPlugins() {
		return res
	}
	if ok, _ := preemptor.PodEligibleToPreemptOthers(ctx, pod, statuses.Get(pod.Status.NominatedNodeName)); !ok {
		// PostFilter ran and tried no node: devicelet answers the same with an empty map
		// (and says why in its message).
		res.Preemption = &Preemption{Nodes: map[string]PreemptionNode{}}
		return res
	}
	candidates, err := statuses.NodesForStatusCode(snapshot.NodeInfos(), fwk.Unschedulable)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.Preemption = &Preemption{Nodes: map[string]PreemptionNode{}}
	for _, n := range candidates {
		nodeCopy := n.Snapshot()
		victims, violations, st := preemptor.SelectVictimsOnNode(ctx, state.Clone(), pod, nodeCopy, c.PDBs)
		pn := PreemptionNode{PDBViolations: violations}
		switch {
		case !st.IsSuccess():
			pn = PreemptionNode{Failure: st.Message()}
		case len(victims) == 0:
			// DryRunPreemption turns this into an error status.
			pn = PreemptionNode{Failure: fmt.Sprintf("expected at least one victim pod on node %q", n.Node().Name)}
		default:
			for _, v := range victims {
				pn.Victims = append(pn.Victims, v.Namespace+"/"+v.Name)
			}
			sort.Strings(pn.Victims)
		}
		res.Preemption.Nodes[n.Node().Name] = pn
	}
	return res
}
