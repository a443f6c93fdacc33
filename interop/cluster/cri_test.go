package cluster

// Cluster mode with a real container runtime (`serve --runtime cri`): Jobs whose containers
// really run in containerd end Succeeded or Failed with their exit codes, and a deleted pod's
// container is stopped within its grace period before the pod object goes.
//
// Needs DEVICELET_CRI_ENDPOINT: interop/cri/run.sh starts a private containerd, imports
// devicelet.local/busybox:1 and runs these tests (CRI_CLUSTER=1). Skipped without it.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const criImage = "devicelet.local/busybox:1"

func criEndpoint(t *testing.T) string {
	t.Helper()
	endpoint := os.Getenv("DEVICELET_CRI_ENDPOINT")
	if endpoint == "" {
		t.Skip("DEVICELET_CRI_ENDPOINT is not set (interop/cri/run.sh starts containerd and sets it)")
	}
	return endpoint
}

// criPodSpec runs `script` in busybox on node `nodeName` with the host's network and no
// service account token (these tests need none; cri_volumes_test.go has pods with one).
func criPodSpec(nodeName, script string, grace int64) corev1.PodSpec {
	return corev1.PodSpec{
		NodeSelector:                  map[string]string{"kubernetes.io/hostname": nodeName},
		RestartPolicy:                 corev1.RestartPolicyNever,
		HostNetwork:                   true,
		AutomountServiceAccountToken:  ptr.To(false),
		TerminationGracePeriodSeconds: ptr.To(grace),
		Containers: []corev1.Container{{
			Name:    "main",
			Image:   criImage,
			Command: []string{"sh", "-c", script},
		}},
	}
}

func createJob(t *testing.T, ns, name string, spec corev1.PodSpec) {
	t.Helper()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template:     corev1.PodTemplateSpec{Spec: spec},
		},
	}
	if _, err := controlPlane.admin.BatchV1().Jobs(ns).Create(ctx(t), job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job %s: %v", name, err)
	}
}

// waitJobCondition waits for the Job's condition `kind` (Complete or Failed) to be True.
func waitJobCondition(t *testing.T, ns, name string, kind batchv1.JobConditionType) {
	t.Helper()
	waitFor(t, 120*time.Second, "job "+name+" "+string(kind), func() (bool, string) {
		job, err := controlPlane.admin.BatchV1().Jobs(ns).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range job.Status.Conditions {
			if c.Type == kind && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", job.Status)
	})
}

// jobPod returns the one pod of Job `name`.
func jobPod(t *testing.T, ns, name string) corev1.Pod {
	t.Helper()
	pods, err := controlPlane.admin.CoreV1().Pods(ns).List(ctx(t), metav1.ListOptions{LabelSelector: "job-name=" + name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of job %s: %v (%d)", name, err, len(pods.Items))
	}
	return pods.Items[0]
}

// runtimeStatusCode is the HTTP status of the node's GET /v1/pods/{uid}/runtime.
func runtimeStatusCode(t *testing.T, n *node, uid string) int {
	t.Helper()
	sock := filepath.Join(n.root, "devicelet", "devicelet.sock")
	client := http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}, Timeout: 10 * time.Second}
	resp, err := client.Get("http://localhost/v1/pods/" + uid + "/runtime")
	if err != nil {
		t.Fatalf("GET runtime status: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestCRIJobsSucceedAndFailWithTheirExitCodes(t *testing.T) {
	endpoint := criEndpoint(t)
	n := startNode(t, "cri-jobs", "--runtime", "cri", "--container-runtime-endpoint", endpoint)
	ns := namespace(t, "cri-jobs")
	nodeObj, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), n.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := nodeObj.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(v, "containerd://") {
		t.Fatalf("containerRuntimeVersion %q, want the runtime's own", v)
	}

	createJob(t, ns, "ok", criPodSpec(n.name, "echo done; exit 0", 5))
	createJob(t, ns, "fails", criPodSpec(n.name, "echo failing; exit 3", 5))

	waitJobCondition(t, ns, "ok", batchv1.JobComplete)
	pod := jobPod(t, ns, "ok")
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod of job ok: phase %s", pod.Status.Phase)
	}
	term := pod.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 0 || term.Reason != "Completed" {
		t.Fatalf("pod of job ok: %+v", pod.Status.ContainerStatuses)
	}
	if got := n.cli(t, "logs", ns+"/"+pod.Name, "main"); got != "done\n" {
		t.Fatalf("logs of job ok: %q", got)
	}

	waitJobCondition(t, ns, "fails", batchv1.JobFailed)
	pod = jobPod(t, ns, "fails")
	waitFor(t, 30*time.Second, "pod of job fails Failed", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pod = *p
		return p.Status.Phase == corev1.PodFailed, fmt.Sprintf("%+v", p.Status)
	})
	term = pod.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 3 || term.Reason != "Error" {
		t.Fatalf("pod of job fails: %+v", pod.Status.ContainerStatuses)
	}
}

func TestCRIDeletionStopsTheContainerWithinTheGracePeriod(t *testing.T) {
	endpoint := criEndpoint(t)
	n := startNode(t, "cri-delete", "--runtime", "cri", "--container-runtime-endpoint", endpoint)
	ns := namespace(t, "cri-delete")
	// Ignores SIGTERM: only the SIGKILL at the end of the 3 s grace period stops it.
	spec := criPodSpec(n.name, "trap '' TERM; echo up; while true; do sleep 1; done", 3)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "stubborn"}, Spec: spec}
	created, err := controlPlane.admin.CoreV1().Pods(ns).Create(ctx(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := string(created.UID)
	waitFor(t, 60*time.Second, "container running", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "stubborn", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		running := p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].State.Running != nil
		return running, fmt.Sprintf("%+v", p.Status)
	})
	if code := runtimeStatusCode(t, n, uid); code != http.StatusOK {
		t.Fatalf("runtime status before deletion: HTTP %d", code)
	}
	start := time.Now()
	if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), "stubborn", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForEvery(t, 60*time.Second, 100*time.Millisecond, "pod object gone", func() (bool, string) {
		_, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "stubborn", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	took := time.Since(start)
	t.Logf("pod object gone %v after the delete (grace period 3 s, SIGTERM ignored)", took)
	// The node deletes the object only after the container stopped: SIGTERM is ignored, so
	// that is the grace period (3 s), and not much more.
	if took < 2500*time.Millisecond || took > 15*time.Second {
		t.Fatalf("pod deleted after %v; want about the 3 s grace period", took)
	}
	if code := runtimeStatusCode(t, n, uid); code != http.StatusNotFound {
		t.Fatalf("runtime status after deletion: HTTP %d (the runtime should have forgotten the pod)", code)
	}
}
