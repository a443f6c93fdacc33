package scheduler

// Shrinking a differing case to a minimal reproducer: fewer nodes, fewer pods, fewer PDBs and
// owners, no config, fewer features on the pod, as long as a difference of the same kind stays.
// Each round tries every one-step-smaller variant at once (one devicelet run) and keeps the
// first that still differs.

import (
	"encoding/json"
	"fmt"
	"path/filepath"
)

// shrink returns the smallest variant of c found that still differs in the given kind, or nil.
func shrink(bin, dir string, c *Case, kind string) *Case {
	best := cloneCase(c)
	for round := 0; round < 30; round++ {
		candidates := smaller(best)
		if len(candidates) == 0 {
			break
		}
		dl, err := runDevicelet(bin, filepath.Join(dir, fmt.Sprint(round)), candidates)
		if err != nil {
			return best
		}
		found := false
		for i, x := range candidates {
			up := runUpstream(x)
			if stillDiffers(x, &up, &dl[i], kind) {
				best, found = x, true
				break
			}
		}
		if !found {
			break
		}
	}
	return best
}

func stillDiffers(c *Case, up, dl *Result, kind string) bool {
	for _, d := range compare(c, up, dl) {
		if d.Kind == kind && knownAs(c, d, up, dl) == "" {
			return true
		}
	}
	return false
}

// smaller lists the one-step-smaller variants of a case, the biggest steps first.
func smaller(c *Case) []*Case {
	var out []*Case
	try := func(edit func(x *Case) bool) {
		x := cloneCase(c)
		if edit(x) {
			x.Name = c.Name
			out = append(out, x)
		}
	}
	for i := range c.Nodes {
		if len(c.Nodes) == 1 {
			break
		}
		try(func(x *Case) bool {
			name := x.Nodes[i].Name
			x.Nodes = append(x.Nodes[:i:i], x.Nodes[i+1:]...)
			kept := x.Pods[:0]
			for _, p := range x.Pods {
				if p.Spec.NodeName != name {
					kept = append(kept, p)
				}
			}
			x.Pods = kept
			return true
		})
	}
	for i := range c.Pods {
		try(func(x *Case) bool { x.Pods = append(x.Pods[:i:i], x.Pods[i+1:]...); return true })
	}
	for i := range c.PDBs {
		try(func(x *Case) bool { x.PDBs = append(x.PDBs[:i:i], x.PDBs[i+1:]...); return true })
	}
	try(func(x *Case) bool {
		had := len(x.Services)+len(x.ReplicaSets)+len(x.StatefulSets)+len(x.ReplicationControllers)+len(x.Pod.OwnerReferences) > 0
		x.Services, x.ReplicaSets, x.StatefulSets, x.ReplicationControllers, x.Pod.OwnerReferences = nil, nil, nil, nil, nil
		return had
	})
	try(func(x *Case) bool { had := len(x.Config) > 0; x.Config = nil; return had })
	// The pod's features, one at a time.
	try(func(x *Case) bool {
		a := x.Pod.Spec.Affinity
		had := a != nil && a.NodeAffinity != nil
		if had {
			a.NodeAffinity = nil
		}
		return had
	})
	try(func(x *Case) bool {
		a := x.Pod.Spec.Affinity
		had := a != nil && a.PodAffinity != nil
		if had {
			a.PodAffinity = nil
		}
		return had
	})
	try(func(x *Case) bool {
		a := x.Pod.Spec.Affinity
		had := a != nil && a.PodAntiAffinity != nil
		if had {
			a.PodAntiAffinity = nil
		}
		return had
	})
	try(func(x *Case) bool {
		had := x.Pod.Spec.TopologySpreadConstraints != nil
		x.Pod.Spec.TopologySpreadConstraints = nil
		return had
	})
	try(func(x *Case) bool { had := x.Pod.Spec.Tolerations != nil; x.Pod.Spec.Tolerations = nil; return had })
	try(func(x *Case) bool { had := x.Pod.Spec.NodeSelector != nil; x.Pod.Spec.NodeSelector = nil; return had })
	try(func(x *Case) bool {
		had := x.Pod.Spec.InitContainers != nil
		x.Pod.Spec.InitContainers = nil
		return had
	})
	try(func(x *Case) bool { had := x.Pod.Spec.Overhead != nil; x.Pod.Spec.Overhead = nil; return had })
	try(func(x *Case) bool { had := x.Pod.Spec.Resources != nil; x.Pod.Spec.Resources = nil; return had })
	// The bound pods' affinity, the nodes' taints and images.
	for i := range c.Pods {
		try(func(x *Case) bool { had := x.Pods[i].Spec.Affinity != nil; x.Pods[i].Spec.Affinity = nil; return had })
	}
	for i := range c.Nodes {
		try(func(x *Case) bool { had := x.Nodes[i].Spec.Taints != nil; x.Nodes[i].Spec.Taints = nil; return had })
		try(func(x *Case) bool { had := x.Nodes[i].Status.Images != nil; x.Nodes[i].Status.Images = nil; return had })
	}
	return out
}

// cloneCase copies a case through JSON.
func cloneCase(c *Case) *Case {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	var x Case
	if err := json.Unmarshal(b, &x); err != nil {
		panic(err)
	}
	return &x
}
