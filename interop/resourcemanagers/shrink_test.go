package resourcemanagers

// Shrinking a failing case to a minimal reproducer: fewer steps, fewer containers, fewer CPU
// options, as long as the first difference stays of the same kind.

import (
	"fmt"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
)

// shrink returns the smallest variant of c found that still differs in the same way.
func shrink(bin, work string, c *Case, kind string, areas map[string]bool, sysfs map[string]string) *Case {
	attempts := 0
	fails := func(x *Case) bool {
		attempts++
		dl, err := replayBatch(bin, filepath.Join(work, "shrink", fmt.Sprint(c.Index), fmt.Sprint(attempts)), []*Case{x}, sysfs)
		if err != nil {
			return false
		}
		kube := runKubelet(x, filepath.Join(work, "shrink", fmt.Sprint(c.Index), fmt.Sprint(attempts), "kubelet"))
		what, _, _, known := compare(x, &kube, &dl[0], areas)
		return what == kind && known == ""
	}
	best := cloneCase(c)
	// Steps after the first difference do not matter.
	kube := runKubelet(best, filepath.Join(work, "shrink", fmt.Sprint(c.Index), "0"))
	if dl, err := replayBatch(bin, filepath.Join(work, "shrink", fmt.Sprint(c.Index), "0d"), []*Case{best}, sysfs); err == nil {
		if _, step, _, _ := compare(best, &kube, &dl[0], areas); step >= 0 && step+1 < len(best.Steps) {
			best.Steps = best.Steps[:step+1]
		}
	}
	for changed := true; changed && attempts < 300; {
		changed = false
		// Drop one step.
		for i := 0; i < len(best.Steps) && attempts < 300; i++ {
			x := cloneCase(best)
			x.Steps = append(x.Steps[:i:i], x.Steps[i+1:]...)
			if fails(x) {
				best, changed = x, true
				i--
			}
		}
		// Drop one container of one pod.
		for i := range best.Steps {
			if best.Steps[i].Admit == nil {
				continue
			}
			for _, init := range []bool{true, false} {
				for j := 0; attempts < 300; j++ {
					x := cloneCase(best)
					spec := &x.Steps[i].Admit.Spec
					list := &spec.Containers
					if init {
						list = &spec.InitContainers
					}
					if j >= len(*list) || (!init && len(*list) == 1) {
						break
					}
					*list = append((*list)[:j:j], (*list)[j+1:]...)
					if fails(x) {
						best, changed = x, true
						j--
					}
				}
			}
		}
		// Drop one CPU option or the topology options.
		for name := range best.CPUOptions {
			x := cloneCase(best)
			delete(x.CPUOptions, name)
			if fails(x) {
				best, changed = x, true
			}
		}
		if len(best.TopologyOptions) > 0 {
			x := cloneCase(best)
			x.TopologyOptions = nil
			if fails(x) {
				best, changed = x, true
			}
		}
	}
	return best
}

func cloneCase(c *Case) *Case {
	x := *c
	x.Steps = nil
	for _, s := range c.Steps {
		if s.Admit != nil {
			x.Steps = append(x.Steps, Step{Admit: s.Admit.DeepCopy()})
		} else {
			x.Steps = append(x.Steps, Step{Remove: s.Remove})
		}
	}
	x.CPUOptions = copyMap(c.CPUOptions)
	x.TopologyOptions = copyMap(c.TopologyOptions)
	x.FeatureGates = map[string]bool{}
	for k, v := range c.FeatureGates {
		x.FeatureGates[k] = v
	}
	return &x
}

// describe is a one-line summary of a case's pods (for the report).
func describe(c *Case) string {
	out := ""
	for _, s := range c.Steps {
		if s.Remove != "" {
			out += fmt.Sprintf(" remove(%s)", s.Remove[len(s.Remove)-2:])
			continue
		}
		out += " admit("
		all := append(append([]v1.Container(nil), s.Admit.Spec.InitContainers...), s.Admit.Spec.Containers...)
		for k, ct := range all {
			if k > 0 {
				out += ","
			}
			cpu := ct.Resources.Requests[v1.ResourceCPU]
			lim := ct.Resources.Limits[v1.ResourceCPU]
			out += fmt.Sprintf("%s cpu=%s/%s", ct.Name, cpu.String(), lim.String())
		}
		out += ")"
	}
	return out
}
