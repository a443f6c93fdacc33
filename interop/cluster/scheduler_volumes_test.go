package cluster

// Volume claims in `devicelet scheduler`: a pod whose PersistentVolumeClaim is bound goes to a
// node its PersistentVolume allows (VolumeBinding for bound claims), a pod whose claim is
// unbound with an Immediate class waits as kube-scheduler's does, and one whose claim waits
// for its first consumer is refused with the field named.

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
