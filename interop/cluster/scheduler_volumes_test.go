package cluster

// Volume claims in `devicelet scheduler`: a pod whose PersistentVolumeClaim is bound goes to a
// node its PersistentVolume allows (VolumeBinding for bound claims), a pod whose claim is
// unbound with an Immediate class waits as kube-scheduler's does, and one whose claim waits
// for its first consumer is refused with the field named; CSI attach limits per CSINode
// (NodeVolumeLimits).

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestSchedulerBoundVolumeDecidesTheNode(t *testing.T) {
	ns := namespace(t, "sched-volumes")
	for i := 0; i < 3; i++ {
		apiNodeFor(t, fmt.Sprintf("vol-%d", i), 1, "vol.example.com")
	}
	// A local volume on vol-2, pre-bound to the claim; the PV controller completes the binding.
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "sched-volumes-pv"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "sched-volumes-manual",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/data"}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: "data"},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"vol-2"}}},
			}}}},
		},
	}
	if _, err := controlPlane.admin.CoreV1().PersistentVolumes().Create(ctx(t), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.CoreV1().PersistentVolumes().Delete(ctx(t), pv.Name, metav1.DeleteOptions{})
	})
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "sched-volumes-wffc"}, Provisioner: "kubernetes.io/no-provisioner", VolumeBindingMode: &wffc}
	if _, err := controlPlane.admin.StorageV1().StorageClasses().Create(ctx(t), class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.StorageV1().StorageClasses().Delete(ctx(t), class.Name, metav1.DeleteOptions{})
	})
	claim := func(name, className, volume string) {
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(className),
				VolumeName:       volume,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
		if _, err := controlPlane.admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx(t), pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	claim("data", "sched-volumes-manual", pv.Name)
	claim("later", "sched-volumes-wffc", "")
	claim("pending", "sched-volumes-immediate", "")
	waitFor(t, 60*time.Second, "claim data bound by the PV controller", func() (bool, string) {
		c, err := controlPlane.admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx(t), "data", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return c.Status.Phase == corev1.ClaimBound, string(c.Status.Phase)
	})
	startScheduler(t)
	withClaim := func(name, claimName string) {
		schedPod(t, ns, name, "", "", func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName},
			}})
		})
	}
	withClaim("uses-data", "data")
	withClaim("uses-later", "later")
	withClaim("uses-pending", "pending")
	withClaim("uses-missing", "missing")
	waitForBound(t, ns, "uses-data", 60*time.Second)
	p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "uses-data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "vol-2" {
		t.Fatalf("uses-data bound to %s; its volume allows only vol-2", p.Spec.NodeName)
	}
	for name, want := range map[string]string{
		"uses-later":   `persistentVolumeClaim (VolumeBinding: claim "later" is unbound and StorageClass "sched-volumes-wffc" binds WaitForFirstConsumer)`,
		"uses-pending": "pod has unbound immediate PersistentVolumeClaims",
		"uses-missing": `persistentvolumeclaim "missing" not found`,
	} {
		waitFor(t, 30*time.Second, name+" unschedulable with its reason", func() (bool, string) {
			p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			c := podScheduledCondition(p)
			if c == nil {
				return false, "no condition"
			}
			return p.Spec.NodeName == "" && c.Reason == "Unschedulable" && strings.Contains(c.Message, want), c.Message
		})
	}
}

// NodeVolumeLimits for CSI volumes: each node's CSINode allows one volume of the driver, so
// two pods with a volume each go to different nodes and a third waits with upstream's reason.
func TestSchedulerVolumeLimitsPerCSINode(t *testing.T) {
	ns := namespace(t, "sched-volume-limits")
	const driver = "csi.limits.example.com"
	nodes := []string{"vlim-0", "vlim-1"}
	for _, n := range nodes {
		apiNodeFor(t, n, 1, "vlim.example.com")
		csiNode := &storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
				Name: driver, NodeID: n, Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To[int32](1)},
			}}},
		}
		if _, err := controlPlane.admin.StorageV1().CSINodes().Create(ctx(t), csiNode, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = controlPlane.admin.StorageV1().CSINodes().Delete(ctx(t), n, metav1.DeleteOptions{})
		})
	}
	// Three CSI volumes pre-bound to their claims; the PV controller completes the bindings.
	for _, name := range []string{"a", "b", "c"} {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "sched-volume-limits-" + name},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              "sched-volume-limits",
				PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "handle-" + name}},
				ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: name},
			},
		}
		if _, err := controlPlane.admin.CoreV1().PersistentVolumes().Create(ctx(t), pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = controlPlane.admin.CoreV1().PersistentVolumes().Delete(ctx(t), pv.Name, metav1.DeleteOptions{})
		})
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To("sched-volume-limits"),
				VolumeName:       pv.Name,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
		if _, err := controlPlane.admin.CoreV1().PersistentVolumeClaims(ns).Create(ctx(t), pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "claim "+name+" bound by the PV controller", func() (bool, string) {
			c, err := controlPlane.admin.CoreV1().PersistentVolumeClaims(ns).Get(ctx(t), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return c.Status.Phase == corev1.ClaimBound, string(c.Status.Phase)
		})
	}
	startScheduler(t)
	withClaim := func(name, claimName string) {
		schedPod(t, ns, name, "", "", func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
			s.NodeSelector = map[string]string{"devicelet.dev/api-only": "true"}
			s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: nodes,
				}}}},
			}}}
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName},
			}})
		})
	}
	withClaim("first", "a")
	waitForBound(t, ns, "first", 60*time.Second)
	withClaim("second", "b")
	waitForBound(t, ns, "second", 60*time.Second)
	first, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "first", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	second, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "second", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if first.Spec.NodeName == second.Spec.NodeName {
		t.Fatalf("both pods on %s, whose CSINode allows one volume of %s", first.Spec.NodeName, driver)
	}
	withClaim("third", "c")
	waitFor(t, 30*time.Second, "third unschedulable for the volume limits", func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), "third", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := podScheduledCondition(p)
		if c == nil {
			return false, "no condition"
		}
		return p.Spec.NodeName == "" && strings.Contains(c.Message, "2 node(s) exceed max volume count"), c.Message
	})
	// Deleting the first pod frees its node's slot: the third pod goes there.
	if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), "first", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitForBound(t, ns, "third", 60*time.Second)
}
