package cluster

// DefaultPreemption that frees devices (spec workloads.md W107, the fix of D-L1): on a devicelet
// node whose two GPUs are held by low-priority pods, a high-priority pod asking for a GPU evicts
// one of them (DisruptionTarget, delete, Preempted event), is nominated, and runs once the
// victim's claim is gone. kube-scheduler 1.36.3 cannot do this: every DRA rejection is
// UnschedulableAndUnresolvable. A pod with preemptionPolicy Never waits instead.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func priorityClass(t *testing.T, name string, value int32, policy *corev1.PreemptionPolicy) {
	t.Helper()
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value, PreemptionPolicy: policy}
	if _, err := controlPlane.admin.SchedulingV1().PriorityClasses().Create(ctx(t), pc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.SchedulingV1().PriorityClasses().Delete(ctx(t), name, metav1.DeleteOptions{})
	})
}

func TestSchedulerPreemptionFreesAGPU(t *testing.T) {
	ns := namespace(t, "sched-preempt")
	n := startNode(t, "preempt-a")
	startTestDriver(t, n, 2)
	deviceClass(t, "preempt-gpu")
	createTemplate(t, ns, "gpu", claimSpec("preempt-gpu"))
	never := corev1.PreemptNever
	priorityClass(t, "preempt-low", 10, nil)
	priorityClass(t, "preempt-high", 1000, nil)
	// The policy comes from the class (admission refuses it in a pod that names a class).
	priorityClass(t, "preempt-polite", 1000, &never)
	_, metrics := startScheduler(t)
	withPriority := func(class string) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) {
			s.PriorityClassName = class
			// Quick termination: the victim's claim is released when its pod is gone.
			s.TerminationGracePeriodSeconds = ptr.To(int64(1))
		}
	}
	for i := 0; i < 2; i++ {
		schedPod(t, ns, fmt.Sprintf("low-%d", i), "gpu", "", withPriority("preempt-low"))
		waitForPodRunning(t, ns, fmt.Sprintf("low-%d", i))
	}
	start := time.Now()
	schedPod(t, ns, "high", "gpu", "", withPriority("preempt-high"))
	high := waitForPodRunning(t, ns, "high")
	t.Logf("high-priority pod running %v after its creation, on %s", time.Since(start).Round(time.Millisecond), high.Spec.NodeName)

	pods, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	left, survivor := 0, ""
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, "low-") && p.DeletionTimestamp == nil {
			left++
			survivor = p.Name
		}
	}
	if left != 1 {
		t.Errorf("%d low-priority pods left, want 1 (one victim is enough)", left)
	}
	events, err := controlPlane.admin.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var preempted []string
	for _, e := range events.Items {
		if e.Reason == "Preempted" {
			preempted = append(preempted, e.InvolvedObject.Name+": "+e.Message)
			want := fmt.Sprintf("Preempted by pod %s on node %s", high.UID, high.Spec.NodeName)
			if e.Message != want || e.Related == nil || e.Related.Name != "high" {
				t.Errorf("Preempted event %q (related %v), want %q related to the preemptor", e.Message, e.Related, want)
			}
		}
	}
	if len(preempted) != 1 {
		t.Errorf("Preempted events: %v, want one", preempted)
	}
	text := scrape(t, metrics)
	if !strings.Contains(text, "scheduler_preemption_attempts_total") || !strings.Contains(text, "scheduler_preemption_victims_count 1") {
		t.Errorf("metrics lack the preemption series:\n%s", grepLines(text, "preemption"))
	}

	// kube-scheduler 1.36.3 on the same node, for a pod above both: no preemption for devices
	// (W102), though evicting the surviving low-priority pod would free a GPU.
	kube := podSpec("", 0)
	usePodClaim(&kube, "gpu", "")
	kube.PriorityClassName = "preempt-high"
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kube-high", Namespace: ns}, Spec: kube}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "kube-scheduler's verdict", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "kube-high", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("kube-scheduler bound kube-high to %s", p.Spec.NodeName)
		}
		c := podScheduledCondition(p)
		if c == nil {
			return false, "no condition"
		}
		return strings.Contains(c.Message, "Preemption is not helpful for scheduling"), c.Message
	})
	if p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), survivor, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("%s gone or being deleted (%v): kube-scheduler preempted it?", survivor, err)
	}
	if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), "kube-high", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// preemptionPolicy Never: it waits, and says why.
	schedPod(t, ns, "polite", "gpu", "", withPriority("preempt-polite"))
	waitFor(t, 30*time.Second, "polite pod unschedulable", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "polite", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := podScheduledCondition(p)
		if c == nil {
			return false, "no condition"
		}
		return strings.Contains(c.Message, "preemption: not eligible due to preemptionPolicy=Never."), c.Message
	})
}

// Workload-aware preemption (W94-W99): a gang of two high-priority GPU pods on a node whose
// four GPUs are held by low-priority pods. The group's dry run evicts exactly two of them for
// the whole group at once (never one member's worth while the other cannot fit, A-L2), the
// victims' events name the PodGroup, and both members run.
func TestSchedulerGangPreemptsForTheWholeGroup(t *testing.T) {
	ns := namespace(t, "gang-preempt")
	n := startNode(t, "gpreempt-a")
	startTestDriver(t, n, 4)
	deviceClass(t, "gpreempt-gpu")
	createTemplate(t, ns, "gpu", claimSpec("gpreempt-gpu"))
	priorityClass(t, "gpreempt-low", 10, nil)
	priorityClass(t, "gpreempt-high", 1000, nil)
	podGroupRBAC(t)
	_, metrics := startScheduler(t)
	withPriority := func(class string, group string) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) {
			s.PriorityClassName = class
			s.TerminationGracePeriodSeconds = ptr.To(int64(1))
			if group != "" {
				s.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(group)}
			}
		}
	}
	for i := 0; i < 4; i++ {
		schedPod(t, ns, fmt.Sprintf("low-%d", i), "gpu", "", withPriority("gpreempt-low", ""))
		waitForPodRunning(t, ns, fmt.Sprintf("low-%d", i))
	}
	createPodGroup(t, ns, "train", 2, "")
	group, err := controlPlane.admin.SchedulingV1alpha2().PodGroups(ns).Get(ctx(t), "train", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := 0; i < 2; i++ {
		schedPod(t, ns, fmt.Sprintf("train-%d", i), "gpu", "", withPriority("gpreempt-high", "train"))
	}
	for i := 0; i < 2; i++ {
		waitForPodRunning(t, ns, fmt.Sprintf("train-%d", i))
	}
	t.Logf("gang of 2 Running %v after its creation", time.Since(start).Round(time.Millisecond))

	pods, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, "low-") && p.DeletionTimestamp == nil {
			left++
		}
	}
	if left != 2 {
		t.Errorf("%d low-priority pods left, want 2 (two victims make room for the group)", left)
	}
	events, err := controlPlane.admin.CoreV1().Events(ns).List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Preempted by podgroup %s on node cluster", group.UID)
	preempted := 0
	for _, e := range events.Items {
		if e.Reason != "Preempted" {
			continue
		}
		preempted++
		if e.Message != want || e.Related == nil || e.Related.Kind != "PodGroup" || e.Related.Name != "train" {
			t.Errorf("Preempted event %q (related %v), want %q related to PodGroup train", e.Message, e.Related, want)
		}
	}
	if preempted != 2 {
		t.Errorf("%d Preempted events, want 2", preempted)
	}
	if text := scrape(t, metrics); !strings.Contains(text, `result="waiting_on_preemption"`) {
		t.Errorf("no waiting_on_preemption attempt in the metrics:\n%s", grepLines(text, "podgroup_schedule_attempts"))
	}
}

// grepLines keeps the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
