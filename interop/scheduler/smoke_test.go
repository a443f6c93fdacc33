package scheduler

import (
	"fmt"
	"math/rand"
	"testing"
	"time"
)

func TestSmoke(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	stats := map[string]int{}
	start := time.Now()
	for i := 0; i < 1000; i++ {
		c := genCase(r, fmt.Sprintf("seed-%d", i))
		res := runUpstream(c)
		if res.Error != "" {
			stats["error "+res.Error[:min(80, len(res.Error))]]++; if stats["printed"] == 0 { stats["printed"]++; t.Log(res.Error) }
			continue
		}
		if res.PreFilter != nil {
			stats["prefilter "+res.PreFilter.Plugin+" "+res.PreFilter.Code]++
		}
		feas := 0
		for _, n := range res.Nodes {
			if n.Rejection != nil {
				stats["reject "+n.Rejection.Plugin+" "+n.Rejection.Code]++
			} else {
				feas++
				for p, s := range n.Scores {
					if s != 0 {
						stats["nonzero score "+p]++
					}
				}
			}
		}
		if feas == 0 {
			stats["no feasible"]++
		}
		if res.Preemption != nil {
			stats["preemption"]++
			for _, pn := range res.Preemption.Nodes {
				if pn.Failure != "" {
					stats["preempt failure "+pn.Failure[:min(50, len(pn.Failure))]]++
				} else {
					stats["preempt victims"]++
					if pn.PDBViolations > 0 {
						stats["preempt pdb violations"]++
					}
				}
			}
		}
	}
	t.Logf("%v", time.Since(start))
	for k, v := range stats {
		t.Logf("%6d %s", v, k)
	}
}
