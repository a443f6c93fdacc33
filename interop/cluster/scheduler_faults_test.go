package cluster

// devicelet's scheduler under faults (issue 25): a pod deleted while it is being bound, a claim
// deleted while its allocation is being written (the scheduler talks to the API server through
// the test's fault proxy, which holds exactly that request until the test has deleted the
// object), and kube-apiserver restarted while hundreds of pods are being scheduled. Nothing may
// be retried forever, no device may be allocated twice, and freed devices are used again.

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// holdOnce makes the proxy hold the first request matching method and path suffix until the
// returned release is called; held is closed when it arrived.
func holdOnce(p *faultProxy, method, suffix string) (held chan struct{}, release func()) {
	held = make(chan struct{})
	gate := make(chan struct{})
	var taken atomic.Bool
	hold := func(r *http.Request) {
		if r.Method != method || !strings.HasSuffix(r.URL.Path, suffix) || !taken.CompareAndSwap(false, true) {
			return
		}
		close(held)
		<-gate
	}
	p.hold.Store(&hold)
	var once atomic.Bool
	return held, func() {
		if once.CompareAndSwap(false, true) {
			close(gate)
		}
	}
}

func waitHeld(t *testing.T, held chan struct{}, what string) {
	t.Helper()
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatalf("the scheduler never sent %s", what)
	}
}

// attemptsOf sums scheduler_schedule_attempts_total{result=RESULT}.
func attemptsOf(t *testing.T, addr, result string) int {
	t.Helper()
	total := 0
	for _, line := range strings.Split(scrape(t, addr), "\n") {
		if strings.HasPrefix(line, "scheduler_schedule_attempts_total{") && strings.Contains(line, `result="`+result+`"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += int(v)
		}
	}
	return total
}

func TestSchedulerObjectsDeletedWhileBinding(t *testing.T) {
	ns := namespace(t, "sched-bindfault")
	apiNode(t, "bindfault-0", 2)
	driverClass(t, "bindfault-gpu", "sched.example.com")
	createTemplate(t, ns, "gpu", claimSpec("bindfault-gpu"))
	proxy := startFaultProxyAs(t, "scheduler")
	kubeconfig := viaProxy(t, filepath.Join(controlPlane.state, "scheduler.kubeconfig"), proxy.url)
	_, metrics := startSchedulerWith(t, kubeconfig)

	// A pod deleted while its binding is in flight: the binding fails, the pod is not retried
	// (it would be, forever, against a pod that is gone), its claim is released and its
	// device goes to the next pod.
	held, release := holdOnce(proxy, http.MethodPost, "/namespaces/"+ns+"/pods/doomed-pod/binding")
	defer release()
	schedPod(t, ns, "doomed-pod", "gpu", "", nil)
	waitHeld(t, held, "the binding of doomed-pod")
	doomed, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "doomed-pod", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	doomedClaim := podClaimName(doomed)
	if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), "doomed-pod", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	release()
	waitFor(t, 60*time.Second, "the deleted pod's claim gone", func() (bool, string) {
		_, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), doomedClaim, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	// Longer than the first two back-offs (1 s, 2 s): a pod brought back would have failed
	// again by now.
	time.Sleep(4 * time.Second)
	errorsAfterDelete := attemptsOf(t, metrics, "error")
	if errorsAfterDelete != 1 {
		t.Errorf("%d failed attempts after the pod was deleted while binding, want 1", errorsAfterDelete)
	}

	// A claim deleted between its finalizer and its allocation: the allocation write is held,
	// the claim deleted (it stays, terminating, because of the finalizer), the write released.
	// The pod must not be bound to a claim on its way out; once the claim is gone and created
	// again, the pod is scheduled with it.
	createClaim(t, ns, "doomed-claim", claimSpec("bindfault-gpu"))
	held, release = holdOnce(proxy, http.MethodPut, "/namespaces/"+ns+"/resourceclaims/doomed-claim/status")
	defer release()
	schedPod(t, ns, "orphan", "", "doomed-claim", nil)
	waitHeld(t, held, "the allocation of doomed-claim")
	if err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Delete(ctx(t), "doomed-claim", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	release()
	waitFor(t, 60*time.Second, "doomed-claim deallocated and gone", func() (bool, string) {
		c, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), "doomed-claim", metav1.GetOptions{})
		if err == nil {
			return false, fmt.Sprintf("still there: allocated %v, reservedFor %v, finalizers %v", c.Status.Allocation != nil, c.Status.ReservedFor, c.Finalizers)
		}
		return apierrors.IsNotFound(err), err.Error()
	})
	orphan, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "orphan", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if orphan.Spec.NodeName != "" {
		t.Fatalf("pod orphan was bound to %s with a claim that was being deleted", orphan.Spec.NodeName)
	}
	createClaim(t, ns, "doomed-claim", claimSpec("bindfault-gpu"))
	waitForBound(t, ns, "orphan", 60*time.Second)

	// Both devices are usable: the deleted pod's was freed.
	schedPod(t, ns, "after", "gpu", "", nil)
	waitForBound(t, ns, "after", 60*time.Second)
	if n := checkAgainstGoAllocator(t, ns); n != 2 {
		t.Errorf("%d allocated claims checked, want 2 (orphan's and after's)", n)
	}
}

// kube-apiserver restarted while 150 pods race for 100 devices: the scheduler's watches
// relist, binds in flight fail and are retried, and in the end exactly 100 pods are bound, the
// others Unschedulable, no device twice, every allocated claim reserved for a bound pod.
func TestSchedulerAPIServerRestartMidRun(t *testing.T) {
	ns := namespace(t, "sched-apirestart")
	const nodes, devicesPerNode, pods = 10, 10, 150
	for i := 0; i < nodes; i++ {
		apiNode(t, fmt.Sprintf("apirestart-%d", i), devicesPerNode)
	}
	driverClass(t, "apirestart-gpu", "sched.example.com")
	createTemplate(t, ns, "gpu", claimSpec("apirestart-gpu"))
	// Pods and claims first, so that the scheduler is mid-run when the API server goes.
	createTemplatePods(t, controlPlane.admin, ns, "r", schedulerName, pods, 8, nil)
	waitForPodClaims(t, controlPlane.admin, ns, pods, 120*time.Second)
	startScheduler(t)
	waitForEvery(t, 60*time.Second, 50*time.Millisecond, "the first pods bound", func() (bool, string) {
		bound, _, err := placement(t, ns, "r")
		return err == nil && bound >= 10, fmt.Sprint(bound, err)
	})
	bound, _, _ := placement(t, ns, "r")
	t.Logf("restarting kube-apiserver with %d of %d pods bound", bound, pods)
	restartAPIServer(t, 5*time.Second)
	waitForEvery(t, 180*time.Second, 2*time.Second, "every pod bound or unschedulable", func() (bool, string) {
		bound, unschedulable, err := placement(t, ns, "r")
		if err != nil {
			return false, err.Error()
		}
		return bound == nodes*devicesPerNode && bound+unschedulable == pods, fmt.Sprintf("%d bound, %d unschedulable", bound, unschedulable)
	})
	if n := checkAgainstGoAllocator(t, ns); n != nodes*devicesPerNode {
		t.Errorf("%d allocated claims, want %d", n, nodes*devicesPerNode)
	}
	// Every allocated claim is reserved for a pod bound to the claim's node (a claim left
	// allocated by a binding that failed is deallocated by PostFilter when its pod is tried
	// again and found unschedulable).
	waitFor(t, 60*time.Second, "every allocated claim reserved for a pod bound on its node", func() (bool, string) {
		list, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		podNode := map[string]string{}
		for _, p := range list.Items {
			podNode[string(p.UID)] = p.Spec.NodeName
		}
		claims, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).List(ctx(t), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range claims.Items {
			if c.Status.Allocation == nil {
				continue
			}
			node := c.Status.Allocation.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values[0]
			if len(c.Status.ReservedFor) != 1 || podNode[string(c.Status.ReservedFor[0].UID)] != node {
				return false, fmt.Sprintf("claim %s allocated on %s is reserved for %v", c.Name, node, c.Status.ReservedFor)
			}
		}
		return true, ""
	})
}

// setDeviceConditions writes conditions into the status.devices entry of the claim's first
// allocated device, as a driver's controller attaching it would.
func setDeviceConditions(t *testing.T, ns, name string, conditions map[string]metav1.ConditionStatus) {
	t.Helper()
	waitFor(t, 30*time.Second, "device conditions written on "+name, func() (bool, string) {
		c, err := controlPlane.admin.ResourceV1().ResourceClaims(ns).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil || c.Status.Allocation == nil {
			return false, fmt.Sprint("not allocated ", err)
		}
		r := c.Status.Allocation.Devices.Results[0]
		status := resourcev1.AllocatedDeviceStatus{Driver: r.Driver, Pool: r.Pool, Device: r.Device}
		for typ, s := range conditions {
			status.Conditions = append(status.Conditions, metav1.Condition{
				Type: typ, Status: s, Reason: "Test", Message: "set by the test", LastTransitionTime: metav1.Now(),
			})
		}
		c.Status.Devices = []resourcev1.AllocatedDeviceStatus{status}
		_, err = controlPlane.admin.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx(t), c, metav1.UpdateOptions{})
		return err == nil, fmt.Sprint(err)
	})
}

// Binding conditions (KEP-5007): a device whose slice lists bindingConditions holds the pod in
// binding (event BindingConditionsPending) until the conditions are True in the claim's
// status.devices; a failure condition fails the binding with the condition named, and the
// claim is deallocated and allocated again.
func TestSchedulerBindingConditions(t *testing.T) {
	ns := namespace(t, "sched-bindcond")
	apiNodeFor(t, "bindcond-0", 0, "empty.example.com")
	var devs []resourcev1.Device
	for i := 0; i < 2; i++ {
		d := gpuDevice(fmt.Sprintf("fabric-%d", i), "a100", 0)
		d.BindsToNode = ptr.To(true)
		d.BindingConditions = []string{"attached"}
		d.BindingFailureConditions = []string{"failed"}
		devs = append(devs, d)
	}
	createSlice(t, "bindcond-fabric", "bindcond-0", "fabric.example.com", 1, 1, devs...)
	driverClass(t, "bindcond-gpu", "fabric.example.com")
	createTemplate(t, ns, "gpu", claimSpec("bindcond-gpu"))
	startScheduler(t)

	schedPod(t, ns, "waits", "gpu", "", nil)
	var claim string
	waitFor(t, 30*time.Second, "waits: claim allocated and BindingConditionsPending", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "waits", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		claim = podClaimName(p)
		events, err := controlPlane.admin.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=waits,reason=BindingConditionsPending"})
		if err != nil {
			return false, err.Error()
		}
		return claim != "" && len(events.Items) > 0, fmt.Sprintf("claim %q, %d events", claim, len(events.Items))
	})
	time.Sleep(2 * time.Second)
	if p, _ := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "waits", metav1.GetOptions{}); p.Spec.NodeName != "" {
		t.Fatalf("bound to %s before its device was attached", p.Spec.NodeName)
	}
	setDeviceConditions(t, ns, claim, map[string]metav1.ConditionStatus{"attached": metav1.ConditionTrue})
	waitForBound(t, ns, "waits", 30*time.Second)

	schedPod(t, ns, "fails", "gpu", "", nil)
	waitFor(t, 30*time.Second, "fails: claim created", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "fails", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		claim = podClaimName(p)
		return claim != "", ""
	})
	setDeviceConditions(t, ns, claim, map[string]metav1.ConditionStatus{"failed": metav1.ConditionTrue})
	waitFor(t, 60*time.Second, "fails: binding failed with the condition named, claim deallocated", func() (bool, string) {
		events, err := controlPlane.admin.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.name=fails,reason=FailedScheduling"})
		if err != nil {
			return false, err.Error()
		}
		failed, deallocated := false, false
		for _, e := range events.Items {
			failed = failed || strings.Contains(e.Message, "binding failed: reason=Test")
			deallocated = deallocated || strings.Contains(e.Message, "deallocation of ResourceClaim completed")
		}
		// Later FailedScheduling events of the pod are one series with the first (as
		// kube-scheduler's recorder makes them): the next attempt's message is the condition's.
		if p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "fails", metav1.GetOptions{}); err == nil {
			if c := podScheduledCondition(p); c != nil {
				deallocated = deallocated || strings.Contains(c.Message, "deallocation of ResourceClaim completed")
			}
		}
		return failed && deallocated, fmt.Sprintf("binding failed %v, deallocated %v", failed, deallocated)
	})
	if p, _ := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "fails", metav1.GetOptions{}); p.Spec.NodeName != "" {
		t.Fatalf("bound to %s although its device failed to attach", p.Spec.NodeName)
	}
}
