package cluster

// deploy/simulated-nodes (issue 39): the kustomization builds, the API server accepts every
// object, and the StatefulSet's two containers, run as written (only the root and the
// bootstrap kubeconfig's paths mapped to a temporary directory, the node named as the pod
// would be), join a node by TLS bootstrap with the advertised capacity and the example
// device plugin's devices allocatable.

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDeploySimulatedNodesJoinAsWritten(t *testing.T) {
	c := controlPlane.admin
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var set *appsv1.StatefulSet
	for _, obj := range kustomizeBuild(t, "simulated-nodes") {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = c.CoreV1().Namespaces().Create(ctx(t), o, metav1.CreateOptions{})
			if err == nil {
				t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(ctx(t), o.Name, metav1.DeleteOptions{}) })
			}
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx(t), o, metav1.CreateOptions{})
			if err == nil {
				t.Cleanup(func() { _ = c.RbacV1().ClusterRoleBindings().Delete(ctx(t), o.Name, metav1.DeleteOptions{}) })
			}
		case *appsv1.StatefulSet:
			set = o
		default:
			t.Errorf("deploy/simulated-nodes: unexpected %T", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("deploy/simulated-nodes: %T: %v", obj, err)
		}
	}
	if set == nil {
		t.Fatal("deploy/simulated-nodes has no StatefulSet")
	}
	if _, err := c.AppsV1().StatefulSets(set.Namespace).Create(ctx(t), set, dry); err != nil {
		t.Fatalf("the API server refuses the StatefulSet: %v", err)
	}
	pod := set.Spec.Template.Spec
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("simulated nodes must not mount a ServiceAccount token: they act as their node only")
	}

	// The containers' arguments as written, with the pod's paths mapped here.
	root := shortTempDir(t)
	_, bootstrapKubeconfig := bootstrapToken(t, kubeadmBootstrapGroup)
	name := set.Name + "-0" // the pod's host name, serve's default node name
	mapped := func(args []string) []string {
		var out []string
		for _, a := range args {
			a = strings.ReplaceAll(a, "/etc/devicelet-bootstrap/kubeconfig", bootstrapKubeconfig)
			a = strings.ReplaceAll(a, "/var/lib/devicelet", root)
			out = append(out, a)
		}
		return out
	}
	var node, plugin []string
	for _, ctr := range pod.Containers {
		switch ctr.Name {
		case "node":
			node = mapped(ctr.Args)
		case "plugin":
			plugin = mapped(ctr.Args)
		}
	}
	if len(node) == 0 || node[0] != "serve" || len(plugin) == 0 || plugin[0] != "example-plugin" {
		t.Fatalf("containers: node %v, plugin %v", node, plugin)
	}
	// Registered first, so it runs last: once the node's process is gone (a running node
	// registers a deleted Node again, and a stopped one would stay, tainted, for later tests).
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	startProcess(t, "simulated node", append(node, "--node-name", name)...)
	startProcess(t, "example plugin", plugin...)
	waitFor(t, 60*time.Second, "node "+name+" Ready", func() (bool, string) { return nodeReady(t, name) })
	nd, err := c.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if capacity := nd.Status.Capacity; capacity.Cpu().Value() != 16 || capacity.Memory().Value() != 64<<30 {
		t.Errorf("capacity %v, want the manifest's cpu 16, memory 64Gi", capacity)
	}
	waitFor(t, 60*time.Second, "8 example.com/gpu allocatable on "+name, func() (bool, string) {
		nd, err := c.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		q := nd.Status.Allocatable[corev1.ResourceName("example.com/gpu")]
		return q.Value() == 8, q.String()
	})
}
