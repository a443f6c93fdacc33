package scheduler

// Shrinking a differing case to a minimal reproducer: fewer nodes, fewer pods, fewer PDBs and
// owners, no config, fewer features on the pod, as long as a difference of the same kind stays.
// Each round tries every one-step-smaller variant at once (one devicelet run) and keeps the
// first that still differs.

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
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
				} else {
					dropPodClaims(x, p)
				}
			}
			x.Pods = kept
			x.ResourceSlices = slices.DeleteFunc(x.ResourceSlices, func(s *resourceapi.ResourceSlice) bool {
				return ptr.Deref(s.Spec.NodeName, "") == name
			})
			return true
		})
	}
	for i := range c.Pods {
		try(func(x *Case) bool {
			dropPodClaims(x, x.Pods[i])
			x.Pods = append(x.Pods[:i:i], x.Pods[i+1:]...)
			return true
		})
	}
	smallerDRA(c, try)
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

// smallerDRA adds (through try) the variants with less DRA: none at all, one claim fewer, one
// request fewer, a request without its selectors or its last alternative, one slice or one
// device fewer (of those no allocation names).
func smallerDRA(c *Case, try func(edit func(x *Case) bool)) {
	if len(c.DeviceClasses)+len(c.ResourceSlices)+len(c.ResourceClaims) == 0 {
		return
	}
	try(func(x *Case) bool {
		x.DeviceClasses, x.ResourceSlices, x.ResourceClaims = nil, nil, nil
		for _, p := range append(x.Pods, x.Pod) {
			p.Spec.ResourceClaims = nil
			for i := range p.Spec.Containers {
				p.Spec.Containers[i].Resources.Claims = nil
			}
		}
		return true
	})
	for i := range c.ResourceClaims {
		try(func(x *Case) bool { dropClaim(x, x.ResourceClaims[i]); return true })
	}
	for i, claim := range c.ResourceClaims {
		if claim.Status.Allocation != nil {
			continue // an allocation names its requests
		}
		for j, req := range claim.Spec.Devices.Requests {
			if len(claim.Spec.Devices.Requests) > 1 {
				try(func(x *Case) bool {
					reqs := &x.ResourceClaims[i].Spec.Devices.Requests
					*reqs = append((*reqs)[:j:j], (*reqs)[j+1:]...)
					return true
				})
			}
			if req.Exactly != nil && len(req.Exactly.Selectors) > 0 {
				try(func(x *Case) bool { x.ResourceClaims[i].Spec.Devices.Requests[j].Exactly.Selectors = nil; return true })
			}
			if len(req.FirstAvailable) > 1 {
				try(func(x *Case) bool {
					subs := &x.ResourceClaims[i].Spec.Devices.Requests[j].FirstAvailable
					*subs = (*subs)[:len(*subs)-1]
					return true
				})
			}
		}
	}
	allocated := map[string]bool{} // pool/device
	for _, claim := range c.ResourceClaims {
		if a := claim.Status.Allocation; a != nil {
			for _, r := range a.Devices.Results {
				allocated[r.Pool+"/"+r.Device] = true
			}
		}
	}
	for i, s := range c.ResourceSlices {
		inUse := false
		for _, d := range s.Spec.Devices {
			inUse = inUse || allocated[s.Spec.Pool.Name+"/"+d.Name]
		}
		if !inUse {
			try(func(x *Case) bool {
				x.ResourceSlices = append(x.ResourceSlices[:i:i], x.ResourceSlices[i+1:]...)
				return true
			})
		}
		for j, d := range s.Spec.Devices {
			if allocated[s.Spec.Pool.Name+"/"+d.Name] {
				continue
			}
			try(func(x *Case) bool {
				devs := &x.ResourceSlices[i].Spec.Devices
				*devs = append((*devs)[:j:j], (*devs)[j+1:]...)
				return true
			})
		}
	}
}

// dropPodClaims removes the claims reserved for the pod alone (a pod that is removed).
func dropPodClaims(x *Case, p *v1.Pod) {
	for _, claim := range slices.Clone(x.ResourceClaims) {
		if rf := claim.Status.ReservedFor; len(rf) == 1 && rf[0].UID == p.UID {
			dropClaim(x, claim)
		}
	}
}

// dropClaim removes a claim and every pod's reference to it.
func dropClaim(x *Case, claim *resourceapi.ResourceClaim) {
	x.ResourceClaims = slices.DeleteFunc(x.ResourceClaims, func(c *resourceapi.ResourceClaim) bool { return c == claim })
	for _, p := range append(slices.Clone(x.Pods), x.Pod) {
		if p.Namespace != claim.Namespace {
			continue
		}
		for _, pc := range slices.Clone(p.Spec.ResourceClaims) {
			if ptr.Deref(pc.ResourceClaimName, "") != claim.Name {
				continue
			}
			p.Spec.ResourceClaims = slices.DeleteFunc(p.Spec.ResourceClaims, func(r v1.PodResourceClaim) bool { return r.Name == pc.Name })
			for i := range p.Spec.Containers {
				cs := &p.Spec.Containers[i].Resources.Claims
				*cs = slices.DeleteFunc(*cs, func(r v1.ResourceClaim) bool { return r.Name == pc.Name })
			}
		}
		if len(p.Spec.ResourceClaims) == 0 {
			p.Spec.ResourceClaims = nil
		}
	}
}
