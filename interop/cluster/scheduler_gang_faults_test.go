package cluster

// Gangs under faults (issue 37): a member deleted while its group waits for the others' claim
// writes (nobody of the group is bound; the group starts once the member is back), the
// scheduler SIGKILLed with part of a group bound (a new scheduler finishes the group from the
// claims already written), and kube-apiserver restarted while ten gangs are placed (never a
// group partly bound, never a device twice).

import (
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// gangClaimOf is the template claim kube-controller-manager made for pod ns/name.
func gangClaimOf(t *testing.T, ns, name string) string {
	t.Helper()
	var claim string
	waitFor(t, 60*time.Second, "the claim of "+name, func() (bool, string) {
		p, err := controlPlane.admin.CoreV1().Pods(ns).Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		claim = podClaimName(p)
		return claim != "", "no claim yet"
	})
	return claim
}

func boundCount(t *testing.T, ns, group string) int {
	t.Helper()
	bound, _, err := groupsBound(t, ns)
	if err != nil {
		t.Fatal(err)
	}
	return bound[group]
}

func TestSchedulerGangMemberDeletedWhileTheGroupWaits(t *testing.T) {
	ns := namespace(t, "gang-deleted")
	apiNodeFor(t, "gangdel-0", 4, "gangdel.example.com")
	driverClass(t, "gangdel-gpu", "gangdel.example.com")
	createTemplate(t, ns, "gpu", claimSpec("gangdel-gpu"))
	podGroupRBAC(t)
	createPodGroup(t, ns, "held", 3, "")
	gangPods(t, ns, []string{"held"}, 3)
	waitForPodClaims(t, controlPlane.admin, ns, 3, 60*time.Second)
	// The allocation write of held-2's claim is held: held-0 and held-1 have written theirs and
	// wait for it.
	proxy := startFaultProxyAs(t, "scheduler")
	held, release := holdOnce(proxy, http.MethodPut, "/namespaces/"+ns+"/resourceclaims/"+gangClaimOf(t, ns, "held-2")+"/status")
	defer release()
	startSchedulerWith(t, viaProxy(t, filepath.Join(controlPlane.state, "scheduler.kubeconfig"), proxy.url))
	waitHeld(t, held, "the allocation of held-2's claim")
	if err := controlPlane.admin.CoreV1().Pods(ns).Delete(ctx(t), "held-2", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	release()
	// The group is short: nobody of it is bound, now or a little later.
	for i := 0; i < 6; i++ {
		if n := boundCount(t, ns, "held"); n != 0 {
			t.Fatalf("%d members of a group short of its quorum were bound", n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The member comes back: the group starts whole.
	schedPod(t, ns, "held-2", "gpu", "", func(s *corev1.PodSpec) {
		s.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("held")}
	})
	waitForEvery(t, 90*time.Second, time.Second, "the group whole once its member is back", func() (bool, string) {
		n := boundCount(t, ns, "held")
		return n == 3, fmt.Sprintf("%d of 3 bound", n)
	})
}

func TestSchedulerGangSchedulerKilledMidGroup(t *testing.T) {
	ns := namespace(t, "gang-killed")
	apiNodeFor(t, "gangkill-0", 4, "gangkill.example.com")
	driverClass(t, "gangkill-gpu", "gangkill.example.com")
	createTemplate(t, ns, "gpu", claimSpec("gangkill-gpu"))
	podGroupRBAC(t)
	createPodGroup(t, ns, "killed", 4, "")
	gangPods(t, ns, []string{"killed"}, 4)
	waitForPodClaims(t, controlPlane.admin, ns, 4, 60*time.Second)
	// killed-3's binding is held: the other members are bound, then the scheduler dies.
	proxy := startFaultProxyAs(t, "scheduler")
	held, release := holdOnce(proxy, http.MethodPost, "/namespaces/"+ns+"/pods/killed-3/binding")
	defer release()
	first, _ := startSchedulerWith(t, viaProxy(t, filepath.Join(controlPlane.state, "scheduler.kubeconfig"), proxy.url))
	waitHeld(t, held, "the binding of killed-3")
	waitForEvery(t, 30*time.Second, 200*time.Millisecond, "the other members bound", func() (bool, string) {
		n := boundCount(t, ns, "killed")
		return n == 3, fmt.Sprintf("%d bound", n)
	})
	first.kill()
	release()
	// A new scheduler finishes the group: killed-3's claim is allocated and reserved for it.
	startScheduler(t)
	waitForEvery(t, 60*time.Second, time.Second, "the group whole after the restart", func() (bool, string) {
		n := boundCount(t, ns, "killed")
		return n == 4, fmt.Sprintf("%d of 4 bound", n)
	})
	_, _, twice := gangAudit(t, controlPlane.admin, ns, 4)
	if twice != 0 {
		t.Fatalf("%d devices allocated twice", twice)
	}
}

func TestSchedulerGangAPIServerRestart(t *testing.T) {
	ns := namespace(t, "gang-apirestart")
	const nodes, devicesPerNode, groups, perGroup = 6, 8, 10, 8
	for i := 0; i < nodes; i++ {
		apiNodeFor(t, fmt.Sprintf("gangapi-%d", i), devicesPerNode, "gangapi.example.com")
	}
	driverClass(t, "gangapi-gpu", "gangapi.example.com")
	createTemplate(t, ns, "gpu", claimSpec("gangapi-gpu"))
	podGroupRBAC(t)
	var names []string
	for g := 0; g < groups; g++ {
		names = append(names, fmt.Sprintf("a%d", g))
		createPodGroup(t, ns, names[g], perGroup, "")
	}
	gangPods(t, ns, names, perGroup)
	waitForPodClaims(t, controlPlane.admin, ns, groups*perGroup, 120*time.Second)
	startScheduler(t)
	waitForEvery(t, 60*time.Second, 50*time.Millisecond, "the first members bound", func() (bool, string) {
		bound, _, err := groupsBound(t, ns)
		total := 0
		for _, n := range bound {
			total += n
		}
		return err == nil && total >= 8, fmt.Sprint(total, err)
	})
	restartAPIServer(t, 5*time.Second)
	var summary string
	waitForEvery(t, 180*time.Second, 2*time.Second, "6 groups whole and 4 empty after the restart", func() (bool, string) {
		whole, partial, twice := gangAudit(t, controlPlane.admin, ns, perGroup)
		summary = fmt.Sprintf("%d whole, %d partly bound, %d devices twice", whole, partial, twice)
		if twice != 0 {
			t.Fatalf("devices allocated twice: %s", summary)
		}
		return whole == nodes*devicesPerNode/perGroup && partial == 0, summary
	})
	t.Log(summary)
}
