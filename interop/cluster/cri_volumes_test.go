package cluster

// Pods on a CRI node use the API from inside: the service account's projected token volume
// (kube-api-access-*, injected by the API server's ServiceAccount admission and left as it is),
// configMap and secret volumes in the kubelet's atomic-writer layout, updated while the
// container runs, and KUBERNETES_SERVICE_HOST/PORT (serve --pod-api-server from-kubeconfig:
// this control plane has no kube-proxy, so the Service's ClusterIP is not reachable).

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// logLine returns the value after `KEY=` on the last line of the container's log starting so.
func logLine(log, key string) (string, bool) {
	value, found := "", false
	for _, line := range strings.Split(log, "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			value, found = v, true
		}
	}
	return value, found
}

func TestCRIPodUsesItsServiceAccountConfigMapAndSecret(t *testing.T) {
	endpoint := criEndpoint(t)
	n := startNode(t, "cri-volumes", "--runtime", "cri", "--container-runtime-endpoint", endpoint,
		"--pod-api-server", "from-kubeconfig")
	ns := namespace(t, "cri-volumes")
	core := controlPlane.admin.CoreV1()
	if _, err := core.ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Data:       map[string]string{"greeting": "hello", "other": "x"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Secrets(ns).Create(ctx(t), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		Data:       map[string][]byte{"password": []byte("s3cret")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// kube-controller-manager publishes the CA to each namespace.
	waitFor(t, 30*time.Second, "kube-root-ca.crt in "+ns, func() (bool, string) {
		_, err := core.ConfigMaps(ns).Get(ctx(t), "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})

	sa := "/var/run/secrets/kubernetes.io/serviceaccount"
	script := strings.Join([]string{
		"echo NAMESPACE=$(cat " + sa + "/namespace)",
		"echo TOKEN=$(cat " + sa + "/token)",
		"echo CA=$(sha256sum " + sa + "/ca.crt | cut -d' ' -f1)",
		"echo API=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT $KUBERNETES_PORT",
		"echo SECRET=$(cat /creds/password)",
		"echo DATA=$(readlink /cfg/..data | cut -c1-4)",
		"echo OPTIONAL=$(ls /opt | wc -l)",
		"echo RO=$(touch /cfg/x 2>/dev/null && echo writable || echo read-only)",
		"i=0; while [ $i -lt 90 ]; do echo CFG=$(cat /cfg/greeting); sleep 0.5; i=$((i+1)); done",
	}, "; ")
	spec := corev1.PodSpec{
		NodeSelector:                  map[string]string{"kubernetes.io/hostname": n.name},
		RestartPolicy:                 corev1.RestartPolicyNever,
		HostNetwork:                   true,
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		Volumes: []corev1.Volume{
			{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
			{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: "creds", DefaultMode: ptr.To[int32](0o400)}}},
			{Name: "opt", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}}},
		},
		Containers: []corev1.Container{{
			Name:    "main",
			Image:   criImage,
			Command: []string{"sh", "-c", script},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "cfg", MountPath: "/cfg"},
				{Name: "creds", MountPath: "/creds"},
				{Name: "opt", MountPath: "/opt"},
			},
		}},
	}
	created, err := core.Pods(ns).Create(ctx(t), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reader"}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The API server's ServiceAccount admission added the default projected volume.
	injected := false
	for _, v := range created.Spec.Volumes {
		injected = injected || (strings.HasPrefix(v.Name, "kube-api-access-") && v.Projected != nil)
	}
	if !injected {
		t.Fatalf("no kube-api-access volume injected: %+v", created.Spec.Volumes)
	}

	var log string
	waitFor(t, 60*time.Second, "the container's first lines", func() (bool, string) {
		p, err := core.Pods(ns).Get(ctx(t), "reader", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase != corev1.PodRunning {
			return false, fmt.Sprintf("%+v", p.Status)
		}
		log = n.cli(t, "logs", ns+"/reader", "main")
		_, ok := logLine(log, "CFG")
		return ok, log
	})
	want := func(key, value string) {
		t.Helper()
		if got, _ := logLine(log, key); got != value {
			t.Fatalf("%s=%q, want %q; log:\n%s", key, got, value, log)
		}
	}
	want("NAMESPACE", ns)
	want("SECRET", "s3cret")
	want("DATA", "..20")
	want("OPTIONAL", "0")
	want("RO", "read-only")
	want("CFG", "hello")
	caPEM, err := os.ReadFile(filepath.Join(controlPlane.state, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(caPEM)
	want("CA", hex.EncodeToString(sum[:]))
	admin, err := clientcmd.BuildConfigFromFlags("", filepath.Join(controlPlane.state, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	server, err := url.Parse(admin.Host)
	if err != nil {
		t.Fatal(err)
	}
	want("API", server.Host+" tcp://"+server.Host)

	// The token is the pod's: the API server authenticates it as the namespace's default
	// service account, bound to this pod.
	token, _ := logLine(log, "TOKEN")
	client, err := kubernetes.NewForConfig(&rest.Config{
		Host:            "https://" + server.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM},
	})
	if err != nil {
		t.Fatal(err)
	}
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx(t), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the pod's token does not authenticate: %v", err)
	}
	user := review.Status.UserInfo
	if user.Username != "system:serviceaccount:"+ns+":default" {
		t.Fatalf("token authenticates as %q", user.Username)
	}
	if got := user.Extra["authentication.kubernetes.io/pod-uid"]; len(got) != 1 || got[0] != string(created.UID) {
		t.Fatalf("token bound to pod %v, want %s", got, created.UID)
	}

	// An update reaches the running container's file (atomically, within the refresh).
	cm, err := core.ConfigMaps(ns).Get(ctx(t), "settings", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["greeting"] = "updated"
	if _, err := core.ConfigMaps(ns).Update(ctx(t), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	updated := time.Now()
	waitFor(t, 30*time.Second, "the update in the container", func() (bool, string) {
		log = n.cli(t, "logs", ns+"/reader", "main")
		got, _ := logLine(log, "CFG")
		return got == "updated", got
	})
	t.Logf("configMap update seen in the container after %v", time.Since(updated).Round(time.Second))

	// Deleting the pod removes its volumes.
	podDir := filepath.Join(n.root, "pods", string(created.UID))
	if _, err := os.Stat(filepath.Join(podDir, "volumes", "kubernetes.io~configmap", "cfg", "..data")); err != nil {
		t.Fatalf("configMap volume not where expected: %v", err)
	}
	if err := core.Pods(ns).Delete(ctx(t), "reader", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "pod gone", func() (bool, string) {
		_, err := core.Pods(ns).Get(ctx(t), "reader", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := os.Stat(podDir); !os.IsNotExist(err) {
		t.Fatalf("pod directory %s still there: %v", podDir, err)
	}
}

func TestCRIMissingConfigMapIsAConfigErrorUntilItExists(t *testing.T) {
	endpoint := criEndpoint(t)
	n := startNode(t, "cri-missing", "--runtime", "cri", "--container-runtime-endpoint", endpoint,
		"--pod-api-server", "from-kubeconfig")
	ns := namespace(t, "cri-missing")
	core := controlPlane.admin.CoreV1()
	spec := criPodSpec(n.name, "cat /cfg/key", 1)
	spec.Volumes = []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "later"}}}}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: "/cfg"}}
	if _, err := core.Pods(ns).Create(ctx(t), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "waits"}, Spec: spec}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "CreateContainerConfigError", func() (bool, string) {
		p, err := core.Pods(ns).Get(ctx(t), "waits", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) != 1 {
			return false, fmt.Sprint(err)
		}
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "CreateContainerConfigError" && strings.Contains(w.Message, "later"),
			fmt.Sprintf("%+v", p.Status.ContainerStatuses[0].State)
	})
	if _, err := core.ConfigMaps(ns).Create(ctx(t), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "later"},
		Data:       map[string]string{"key": "arrived"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Retried after the back-off (10 s).
	waitFor(t, 40*time.Second, "pod Succeeded", func() (bool, string) {
		p, err := core.Pods(ns).Get(ctx(t), "waits", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodSucceeded, fmt.Sprintf("%+v", p.Status)
	})
	if got := n.cli(t, "logs", ns+"/waits", "main"); got != "arrived" {
		t.Fatalf("logs %q", got)
	}
}
