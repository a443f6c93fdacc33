package cluster

// Shutdown while binding (issue 39): a pod held in binding by its device's binding conditions
// (KEP-5007) when the scheduler gets SIGTERM. The binding gives up at once and is undone (the
// pod is not bound, the claim no longer reserved for it), the process exits promptly, not
// after the binding timeout, and a new scheduler binds the pod once the device is attached.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestSchedulerShutdownUndoesAWaitingBinding(t *testing.T) {
	ns := namespace(t, "sched-shutdown")
	apiNodeFor(t, "shutdown-0", 0, "empty.example.com")
	d := gpuDevice("fabric-0", "a100", 0)
	d.BindsToNode = ptr.To(true)
	d.BindingConditions = []string{"attached"}
	d.BindingFailureConditions = []string{"failed"}
	createSlice(t, "shutdown-fabric", "shutdown-0", "fabric.example.com", 1, 1, d)
	driverClass(t, "shutdown-gpu", "fabric.example.com")
	createTemplate(t, ns, "gpu", claimSpec("shutdown-gpu"))
	first, _ := startScheduler(t)

	schedPod(t, ns, "waits", "gpu", "", nil)
	var claim string
	waitFor(t, 30*time.Second, "claim allocated and reserved, binding waiting", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "waits", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		claim = podClaimName(p)
		if claim == "" {
			return false, "no claim yet"
		}
		c, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), claim, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return c.Status.Allocation != nil && len(c.Status.ReservedFor) == 1, fmt.Sprintf("%+v", c.Status)
	})
	stopped := time.Now()
	first.stop()
	took := time.Since(stopped)
	t.Logf("the scheduler exited %v after SIGTERM with a binding waiting", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("exit took %v with a binding waiting, want the binding undone at once", took)
	}
	log := first.output.String()
	if !strings.Contains(log, "shutting down") || !strings.Contains(log, "unreserving") {
		t.Errorf("the waiting binding was not undone on shutdown:\n%s", lastLines(log, 20))
	}
	c, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Status.ReservedFor) != 0 {
		t.Errorf("claim still reserved after the shutdown: %+v", c.Status.ReservedFor)
	}
	if p, _ := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "waits", metav1.GetOptions{}); p.Spec.NodeName != "" {
		t.Fatalf("bound to %s by a scheduler shutting down", p.Spec.NodeName)
	}

	// Nothing is left half-done: the next scheduler binds the pod once the device is attached.
	startScheduler(t)
	waitFor(t, 30*time.Second, "claim reserved again", func() (bool, string) {
		c, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), claim, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return c.Status.Allocation != nil && len(c.Status.ReservedFor) == 1, fmt.Sprintf("%+v", c.Status)
	})
	setDeviceConditions(t, ns, claim, map[string]metav1.ConditionStatus{"attached": metav1.ConditionTrue})
	waitForBound(t, ns, "waits", 30*time.Second)
}
