package cluster

// Faults: devicelet SIGKILLed mid-rollout, a pod force-deleted while devicelet is down,
// kube-apiserver restarted, the Node object deleted and recreated.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// admissions counts, from devicelet's own log, how often the cluster front end admitted each
// pod UID (a pod resumed after a restart logs "pod admitted before a restart; resuming").
func admissions(output string) map[string]int {
	counts := map[string]int{}
	for _, line := range strings.Split(output, "\n") {
		if !strings.Contains(line, "devicelet_kube::pods: pod admitted pod=") {
			continue
		}
		if i := strings.Index(line, "uid="); i >= 0 {
			uid := strings.Fields(line[i+4:])[0]
			counts[strings.Trim(uid, `"`)]++
		}
	}
	return counts
}

// TestSigkillMidRollout: devicelet is SIGKILLed while a Deployment rolls out and started again
// on the same root: every pod ends Running exactly once with its own devices; pods admitted
// before the kill keep theirs.
func TestSigkillMidRollout(t *testing.T) {
	ns := namespace(t, "sigkill")
	n := startNode(t, "node-sigkill")
	n.plugin(t, "--devices", "8")
	waitForResource(t, n.name, gpu, 8, 8)

	createDeployment(t, ns, "roll", n.name, 8, 1)
	// Kill as soon as some, not all, pods are admitted.
	waitFor(t, 90*time.Second, "some admitted pods", func() (bool, string) {
		held := podResources(t, n)
		return len(held) >= 2, fmt.Sprint(held)
	})
	before := podResources(t, n)
	log1 := n.devicelet.output.String()
	n.devicelet.kill()
	n.start(t)
	waitForRunning(t, ns, "roll", 8, 120*time.Second)
	after := podResources(t, n)
	if len(after) != 8 {
		t.Fatalf("PodResources after restart lists %v, want 8 pods", after)
	}
	distinctDevices(t, after, 1)
	for pod, ids := range before {
		if fmt.Sprint(after[pod]) != fmt.Sprint(ids) {
			t.Fatalf("pod %s held %v before the kill and %v after", pod, ids, after[pod])
		}
	}
	// The restarted devicelet admitted only the pods the first one had not.
	first, second := admissions(log1), admissions(n.devicelet.output.String())
	for uid := range second {
		if first[uid] > 0 {
			t.Fatalf("pod %s admitted by both runs", uid)
		}
	}
	for uid, c := range first {
		if c != 1 {
			t.Fatalf("pod %s admitted %d times", uid, c)
		}
	}
}

// TestForceDeletedWhileDownIsReleased: a pod force-deleted while devicelet is down is released
// from the checkpoint at start, and its device goes to the next pod.
func TestForceDeletedWhileDownIsReleased(t *testing.T) {
	ns := namespace(t, "forcedel")
	n := startNode(t, "node-forcedel")
	n.plugin(t, "--devices", "2")
	waitForResource(t, n.name, gpu, 2, 2)
	createDeployment(t, ns, "full", n.name, 2, 1)
	pods := waitForRunning(t, ns, "full", 2, 90*time.Second)

	n.devicelet.kill()
	victim := pods[0].Name
	if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), victim,
		metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	// The ReplicaSet replaces it at once; the replacement waits for a device.
	n.start(t)
	waitForRunning(t, ns, "full", 2, 90*time.Second)
	held := podResources(t, n)
	if _, still := held[victim]; still || len(held) != 2 {
		t.Fatalf("PodResources after restart: %v (force-deleted %s must be gone)", held, victim)
	}
	distinctDevices(t, held, 1)
	if held[pods[1].Name] == nil {
		t.Fatalf("the surviving pod %s lost its device: %v", pods[1].Name, held)
	}
}

// restartAPIServer stops kube-apiserver and starts it again with the same command line,
// `down` later. kube-controller-manager is restarted too once the API server is back: after an
// outage its controllers' watches may take minutes to recover (template claims and
// ServiceAccounts of later tests then lag; it made the next test time out in CI), which is
// not what these tests look at.
func restartAPIServer(t *testing.T, down time.Duration) {
	t.Helper()
	restartControlPlaneProcess(t, "kube-apiserver", down)
	waitFor(t, 90*time.Second, "kube-apiserver ready again", func() (bool, string) {
		body, err := controlPlane.admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx(t))
		return err == nil, fmt.Sprint(err, string(body))
	})
	restartControlPlaneProcess(t, "kube-controller-manager", 0)
	// Ready when its ServiceAccount controller makes a new namespace's default account.
	probe := fmt.Sprintf("kcm-probe-%d", time.Now().UnixNano())
	if _, err := controlPlane.admin.CoreV1().Namespaces().Create(ctx(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: probe}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = controlPlane.admin.CoreV1().Namespaces().Delete(context.Background(), probe, metav1.DeleteOptions{})
	}()
	waitFor(t, 90*time.Second, "kube-controller-manager working again", func() (bool, string) {
		_, err := controlPlane.admin.CoreV1().ServiceAccounts(probe).Get(ctx(t), "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
}

// restartControlPlaneProcess stops the control-plane process `name` (as named in the pids
// file) and starts it again with the same command line `down` later, its output appended to
// its log.
func restartControlPlaneProcess(t *testing.T, name string, down time.Duration) {
	t.Helper()
	pidsFile := filepath.Join(controlPlane.state, "pids")
	data, err := os.ReadFile(pidsFile)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	var args []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[1] == name {
			pid, _ := strconv.Atoi(f[0])
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil {
				t.Fatalf("reading %s's command line: %v", name, err)
			}
			args = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
			_ = syscall.Kill(pid, syscall.SIGTERM)
			for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(100 * time.Millisecond)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
			continue
		}
		lines = append(lines, line)
	}
	if args == nil {
		t.Fatalf("%s is not in the pids file", name)
	}
	time.Sleep(down)
	logf, err := os.OpenFile(filepath.Join(controlPlane.state, "logs", name+".log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	lines = append(lines, fmt.Sprintf("%d %s", cmd.Process.Pid, name))
	writeFile(t, pidsFile, strings.Join(lines, "\n")+"\n")
}

// TestAPIServerRestart: kube-apiserver goes away for 15 s and comes back: the node stays
// Ready, its Lease is renewed again, running pods keep their devices, no pod is admitted twice,
// and a pod created afterwards is admitted.
func TestAPIServerRestart(t *testing.T) {
	ns := namespace(t, "apirestart")
	n := startNode(t, "node-apirestart")
	n.plugin(t, "--devices", "4")
	waitForResource(t, n.name, gpu, 4, 4)
	createDeployment(t, ns, "steady", n.name, 2, 1)
	waitForRunning(t, ns, "steady", 2, 90*time.Second)
	before := podResources(t, n)

	restartAPIServer(t, 15*time.Second)
	lease := func() *coordinationv1.Lease {
		l, err := controlPlane.admin.CoordinationV1().Leases("kube-node-lease").Get(ctx(t), n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("lease: %v", err)
		}
		return l
	}
	renewed := lease().Spec.RenewTime.Time
	waitFor(t, 40*time.Second, "the Lease renewed after the restart", func() (bool, string) {
		r := lease().Spec.RenewTime.Time
		return r.After(renewed), r.String()
	})
	_, _, ready := resourceOf(t, n.name, gpu)
	if !ready {
		t.Fatal("node not Ready after the API server restart")
	}
	// A new pod after the restart reaches devicelet through its re-established watch. It is
	// bound by name, not through kube-scheduler: after an API server restart kube-scheduler
	// may keep a new pod unschedulable for minutes (a node taint seen before its own watch
	// recovers, then its unschedulable-queue back-off), which is not devicelet's doing and
	// made this test flaky in CI. (A NoExecute unreachable taint would only evict after the
	// default 300 s toleration.)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "after-restart", Namespace: ns, Labels: map[string]string{"app": "after-restart"}},
		Spec:       podSpec("", 1),
	}
	p.Spec.NodeName = n.name
	if _, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	waitForRunning(t, ns, "after-restart", 1, 60*time.Second)
	after := podResources(t, n)
	distinctDevices(t, after, 1)
	for pod, ids := range before {
		if fmt.Sprint(after[pod]) != fmt.Sprint(ids) {
			t.Fatalf("pod %s held %v before the restart and %v after", pod, ids, after[pod])
		}
	}
	for uid, c := range admissions(n.devicelet.output.String()) {
		if c != 1 {
			t.Fatalf("pod %s admitted %d times", uid, c)
		}
	}
}

// TestNodeDeletedAndRecreated: the Node object is deleted and recreated by someone else with a
// stale extended resource: devicelet reports the stale resource as 0 and advertises its own
// devices again, without a restart.
func TestNodeDeletedAndRecreated(t *testing.T) {
	n := startNode(t, "node-recreate")
	n.plugin(t, "--devices", "3")
	waitForResource(t, n.name, gpu, 3, 3)
	old, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), n.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := controlPlane.admin.CoreV1().Nodes().Delete(ctx(t), n.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Recreated by someone else (or by devicelet, whichever is first), then given a stale
	// extended resource as a manifest restored from an old backup would carry.
	stale := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name,
		Labels: map[string]string{"kubernetes.io/hostname": n.name}}}
	if _, err := controlPlane.admin.CoreV1().Nodes().Create(ctx(t), stale, metav1.CreateOptions{}); err != nil {
		t.Logf("recreating the Node: %v (devicelet registered it again first)", err)
	}
	waitFor(t, 30*time.Second, "the Node to exist again", func() (bool, string) {
		nd, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), n.name, metav1.GetOptions{})
		return err == nil && nd.UID != old.UID, fmt.Sprint(err)
	})
	// A patch, not an update: devicelet may have written the new object's status already.
	stalePatch := []byte(`{"status":{"capacity":{"example.com/stale":"5"},"allocatable":{"example.com/stale":"5"}}}`)
	if _, err := controlPlane.admin.CoreV1().Nodes().Patch(ctx(t), n.name, types.StrategicMergePatchType,
		stalePatch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("setting a stale resource: %v", err)
	}
	waitForResource(t, n.name, gpu, 3, 3)
	nd, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), n.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nd.UID == old.UID {
		t.Fatal("the Node has its old UID: it was not recreated")
	}
	waitForResource(t, n.name, "example.com/stale", 0, 0)
}
