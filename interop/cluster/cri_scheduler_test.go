package cluster

// The scheduler as a pod on a devicelet node (issue 39): deploy/scheduler's objects, as
// `kubectl apply -k` creates them, with the image the repo's script builds, run on a devicelet
// node with `--runtime cri` (containerd). The pods authenticate with their projected
// ServiceAccount tokens through the in-cluster configuration, elect a leader on the Lease and
// schedule a DRA pod onto a simulated devicelet node. Deleting the leader pod hands the Lease
// to another replica within 3 s (the leader releases it on SIGTERM).
//
// Needs DEVICELET_CRI_ENDPOINT and DEVICELET_TEST_IMAGE (interop/cri/run.sh builds the image
// from DEVICELET_BIN with deploy/image/build.sh and imports it). Skipped without them.

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var leaderIdentity = regexp.MustCompile(`campaigning for the leader lease identity=(\S+)`)

func TestCRISchedulerDeploymentRunsOnDeviceletNodes(t *testing.T) {
	endpoint := criEndpoint(t)
	image := os.Getenv("DEVICELET_TEST_IMAGE")
	if image == "" {
		t.Skip("DEVICELET_TEST_IMAGE is not set (interop/cri/run.sh builds and imports it)")
	}
	c := controlPlane.admin
	// Two devicelet nodes on the same containerd, one replica each (the Deployment's container
	// port becomes a host port with the host network, so two cannot share a node).
	hosts := map[string]*node{}
	for _, name := range []string{"cri-sched-a", "cri-sched-b"} {
		n := startNode(t, name, "--runtime", "cri", "--container-runtime-endpoint", endpoint,
			"--pod-api-server", "from-kubeconfig")
		patch := []byte(`{"metadata":{"labels":{"devicelet.test/cri-scheduler-host":"true"}}}`)
		if _, err := c.CoreV1().Nodes().Patch(ctx(t), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		hosts[name] = n
	}
	applyDeployRBAC(t)
	const ns = "devicelet-system"
	var deployment *appsv1.Deployment
	for _, obj := range kustomizeBuild(t, "scheduler") {
		var err error
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			_, err = c.CoreV1().ConfigMaps(o.Namespace).Create(ctx(t), o, metav1.CreateOptions{})
		case *policyv1.PodDisruptionBudget:
			_, err = c.PolicyV1().PodDisruptionBudgets(o.Namespace).Create(ctx(t), o, metav1.CreateOptions{})
		case *appsv1.Deployment:
			deployment = o
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if deployment == nil {
		t.Fatal("deploy/scheduler has no Deployment")
	}
	// What this test machine needs, nothing else: the test image; the API server is on the
	// host's loopback (no kube-proxy), so host network, which puts both replicas on one
	// network: each binds a free port.
	spec := &deployment.Spec.Template.Spec
	spec.HostNetwork = true
	spec.NodeSelector = map[string]string{"devicelet.test/cri-scheduler-host": "true"}
	ctr := &spec.Containers[0]
	ctr.Image = image
	for i, a := range ctr.Args {
		if strings.HasPrefix(a, "--secure-address=") {
			ctr.Args[i] = "--secure-address=127.0.0.1:0"
		}
	}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx(t), deployment, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	started := time.Now()

	// Both replicas run on the devicelet node, one leads.
	var pods []corev1.Pod
	waitFor(t, 120*time.Second, "2 scheduler pods Running on the devicelet CRI nodes", func() (bool, string) {
		list, err := c.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=devicelet-scheduler"})
		if err != nil {
			return false, err.Error()
		}
		pods = nil
		var states []string
		for _, p := range list.Items {
			if hosts[p.Spec.NodeName] != nil && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
			states = append(states, fmt.Sprintf("%s on %q: %s %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses))
		}
		return len(pods) == 2, strings.Join(states, "; ")
	})
	t.Logf("2 scheduler pods Running %v after the Deployment was created", time.Since(started).Round(time.Millisecond))
	identities := map[string]string{} // holder identity -> pod
	holder := func() string {
		l, err := c.CoordinationV1().Leases(ns).Get(ctx(t), "devicelet-scheduler", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	waitFor(t, 60*time.Second, "a scheduler pod holds the Lease", func() (bool, string) {
		for _, p := range pods {
			if m := leaderIdentity.FindStringSubmatch(podLog(hosts[p.Spec.NodeName], p)); m != nil {
				identities[m[1]] = p.Name
			}
		}
		h := holder()
		_, ours := identities[h]
		return ours, fmt.Sprintf("holder %q, identities %v", h, identities)
	})
	leader := identities[holder()]
	t.Logf("leader: pod %s", leader)
	for _, p := range pods {
		log := podLog(hosts[p.Spec.NodeName], p)
		if strings.Contains(strings.ToLower(log), "forbidden") || strings.Contains(log, "Unauthorized") {
			t.Errorf("pod %s was refused something:\n%s", p.Name, lastLines(log, 20))
		}
	}

	// It schedules a DRA pod onto a simulated devicelet node.
	sim := startNode(t, "cri-sched-sim")
	startTestDriver(t, sim, 2)
	driverClass(t, "cri-sched-gpu", testDriver)
	work := namespace(t, "cri-sched")
	createTemplate(t, work, "gpu", claimSpec("cri-sched-gpu"))
	schedPod(t, work, "first", "gpu", "", func(s *corev1.PodSpec) {
		s.NodeSelector = map[string]string{"kubernetes.io/hostname": sim.name}
	})
	waitForPodRunning(t, work, "first")

	// Deleting the leader pod: it releases the Lease on SIGTERM and another replica leads at
	// once: the standby at its next retry (2 s), or the Deployment's replacement pod if it
	// starts and campaigns first. Without the release it would take the 15 s lease.
	old := holder()
	deleted := time.Now()
	if err := c.CoreV1().Pods(ns).Delete(ctx(t), leader, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var next string
	waitForEvery(t, 10*time.Second, 50*time.Millisecond, "another replica leads", func() (bool, string) {
		next = holder()
		return next != "" && next != old, next
	})
	took := time.Since(deleted)
	who := "the Deployment's replacement pod"
	if p, ok := identities[next]; ok {
		who = "the standby " + p
	}
	t.Logf("%s leads %v after the leader pod's deletion", who, took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("a new leader took %v after the leader pod's deletion, want at most 3 s", took)
	}
	schedPod(t, work, "second", "gpu", "", func(s *corev1.PodSpec) {
		s.NodeSelector = map[string]string{"kubernetes.io/hostname": sim.name}
	})
	waitForPodRunning(t, work, "second")
}

// podLog is the scheduler container's log of pod p on devicelet node n ("" while it has none).
func podLog(n *node, p corev1.Pod) string {
	out, err := exec.Command(os.Getenv("DEVICELET_BIN"), "--root-dir", n.root,
		"logs", p.Namespace+"/"+p.Name, "scheduler").Output()
	if err != nil {
		return ""
	}
	return string(out)
}
