package cluster

// deploy/scheduler's role has no spare rule (issue 39): for each rule of the ClusterRole
// devicelet-scheduler and of the Lease Role, the scheduler runs under a fresh ServiceAccount
// bound to a copy of the roles without that one rule (its own scheduler name, namespace and
// Lease, so the runs go side by side) through deployWorkload, and must fail visibly: never
// ready (a list or watch missing), a workload step not done in time, the secure port answering
// wrong, or a "forbidden" in its log (debug level, where refused best-effort writes show). A
// control run with every rule must pass the same checks with the same timeouts.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ablation is one run: the roles' rules with at most one left out.
type ablation struct {
	id      string // names the run's namespace, scheduler, nodes and classes
	name    string // subtest name
	removed string // the rule left out ("" for the control run)
	cluster []rbacv1.PolicyRule
	lease   []rbacv1.PolicyRule
}

func ruleString(r rbacv1.PolicyRule) string {
	groups := make([]string, len(r.APIGroups))
	for i, g := range r.APIGroups {
		groups[i] = g
		if g == "" {
			groups[i] = "core"
		}
	}
	return fmt.Sprintf("%s %s %v", strings.Join(groups, ","), strings.Join(r.Resources, ","), r.Verbs)
}

// splitRule is r as rules of one resource and one verb each.
func splitRule(r rbacv1.PolicyRule) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	for _, res := range r.Resources {
		for _, v := range r.Verbs {
			out = append(out, rbacv1.PolicyRule{APIGroups: r.APIGroups, Resources: []string{res}, Verbs: []string{v}})
		}
	}
	return out
}

// withoutAtom is r without its j-th resource and verb (splitRule's order).
func withoutAtom(r rbacv1.PolicyRule, j int) []rbacv1.PolicyRule {
	return without(splitRule(r), j)
}

func without(rules []rbacv1.PolicyRule, i int) []rbacv1.PolicyRule {
	out := append([]rbacv1.PolicyRule{}, rules[:i]...)
	return append(out, rules[i+1:]...)
}

// ablationShared is what every run's secure-port check uses.
type ablationShared struct {
	unbound, unboundUser, reader string
}

func TestSchedulerDeployRoleHasNoSpareRule(t *testing.T) {
	start := time.Now()
	var role, reader *rbacv1.ClusterRole
	var lease *rbacv1.Role
	for _, obj := range deployObjects(t, "rbac.yaml") {
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			switch o.Name {
			case "devicelet-scheduler":
				role = o
			case "devicelet-scheduler-metrics-reader":
				reader = o
			}
		case *rbacv1.Role:
			lease = o
		}
	}
	if role == nil || reader == nil || lease == nil {
		t.Fatalf("deploy/scheduler/rbac.yaml: ClusterRoles devicelet-scheduler (%v), devicelet-scheduler-metrics-reader (%v) and a Role (%v) wanted",
			role != nil, reader != nil, lease != nil)
	}

	// The secure port's callers, shared by every run: one allowed nothing, one bound to a
	// copy of the metrics reader role.
	shared := namespace(t, "sched-ablation")
	readerCopy := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "devicelet-ablation-metrics-reader"}, Rules: reader.Rules}
	readerBinding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: readerCopy.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: readerCopy.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: shared}},
	}
	createClusterRBAC(t, readerCopy, readerBinding)
	sh := ablationShared{
		unbound:     saToken(t, shared, "not-prometheus"),
		unboundUser: "system:serviceaccount:" + shared + ":not-prometheus",
		reader:      saToken(t, shared, "prometheus"),
	}
	waitForAllowed(t, "system:serviceaccount:"+shared+":prometheus", authorizationv1.SubjectAccessReviewSpec{
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}})

	runs := []ablation{{id: "abl-all", name: "control", cluster: role.Rules, lease: lease.Rules}}
	for i, r := range role.Rules {
		runs = append(runs, ablation{id: fmt.Sprintf("abl-c%02d", i), name: fmt.Sprintf("clusterrole-%02d", i),
			removed: "ClusterRole devicelet-scheduler: " + ruleString(r), cluster: without(role.Rules, i), lease: lease.Rules})
	}
	for i, r := range lease.Rules {
		runs = append(runs, ablation{id: fmt.Sprintf("abl-l%02d", i), name: fmt.Sprintf("lease-role-%02d", i),
			removed: "Role " + lease.Name + ": " + ruleString(r), cluster: role.Rules, lease: without(lease.Rules, i)})
	}
	// Finer, on demand (about 1.5 minutes more): each resource and verb of a rule that has more
	// than one, left out alone. Today three such runs fail: resourceclaims get (a conflict's
	// re-read), patch and delete (removing a special claim after a failed binding or in
	// PostFilter) serve paths this workload does not provoke.
	if os.Getenv("DEVICELET_RBAC_ABLATE_VERBS") != "" {
		for i, r := range role.Rules {
			for j, atom := range splitRule(r) {
				if len(splitRule(r)) == 1 {
					break
				}
				runs = append(runs, ablation{id: fmt.Sprintf("abl-c%02dv%d", i, j), name: fmt.Sprintf("clusterrole-%02d-verb-%d", i, j),
					removed: "ClusterRole devicelet-scheduler: " + ruleString(atom) + " (of " + ruleString(r) + ")",
					cluster: append(without(role.Rules, i), withoutAtom(r, j)...), lease: lease.Rules})
			}
		}
		for i, r := range lease.Rules {
			for j, atom := range splitRule(r) {
				if len(splitRule(r)) == 1 {
					break
				}
				runs = append(runs, ablation{id: fmt.Sprintf("abl-l%02dv%d", i, j), name: fmt.Sprintf("lease-role-%02d-verb-%d", i, j),
					removed: "Role " + lease.Name + ": " + ruleString(atom) + " (of " + ruleString(r) + ")",
					cluster: role.Rules, lease: append(without(lease.Rules, i), withoutAtom(r, j)...)})
			}
		}
	}

	// Subtests run from a pool of workers (t.Run from several goroutines), not t.Parallel,
	// which -test.parallel (GOMAXPROCS) would hold to two at a time.
	const workers = 4
	var mu sync.Mutex
	caught := map[string][]string{}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				a := runs[i]
				t.Run(a.name, func(t *testing.T) {
					signals := runAblation(t, a, sh)
					mu.Lock()
					caught[a.name] = signals
					mu.Unlock()
					switch {
					case a.removed == "" && len(signals) > 0:
						t.Errorf("with every rule of deploy/scheduler's roles the scheduler failed: %s", strings.Join(signals, "; "))
					case a.removed != "" && len(signals) == 0:
						t.Errorf("spare rule: without %s the scheduler still did everything", a.removed)
					}
				})
			}
		}()
	}
	for i := range runs {
		jobs <- i
	}
	close(jobs)
	wg.Wait()

	var report []string
	for _, a := range runs {
		signals, ok := caught[a.name]
		what := a.removed
		if what == "" {
			what = "(nothing removed)"
		}
		switch {
		case !ok:
			report = append(report, fmt.Sprintf("%-16s %s: did not finish", a.name, what))
		case len(signals) == 0:
			report = append(report, fmt.Sprintf("%-16s %s: no failure", a.name, what))
		default:
			var kinds []string
			for _, s := range signals {
				kind, _, _ := strings.Cut(s, ":")
				kinds = append(kinds, kind)
			}
			report = append(report, fmt.Sprintf("%-16s %s: caught by %s", a.name, what, strings.Join(kinds, " + ")))
		}
	}
	t.Logf("%d runs in %v (%d workers):\n%s", len(runs), time.Since(start).Round(time.Second), workers, strings.Join(report, "\n"))
}

// createClusterRBAC creates a ClusterRole and its binding, deleted at the end of the test.
func createClusterRBAC(t *testing.T, role *rbacv1.ClusterRole, binding *rbacv1.ClusterRoleBinding) {
	t.Helper()
	c := controlPlane.admin
	if _, err := c.RbacV1().ClusterRoles().Create(ctx(t), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{}) })
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx(t), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
}

// waitForAllowed waits until the API server's RBAC cache allows `user` what spec asks, so that
// a run does not start before its roles are in force (and log a refusal that is only lag).
func waitForAllowed(t *testing.T, user string, spec authorizationv1.SubjectAccessReviewSpec) {
	t.Helper()
	spec.User = user
	waitFor(t, 30*time.Second, user+" allowed "+fmt.Sprint(spec.ResourceAttributes, spec.NonResourceAttributes), func() (bool, string) {
		r, err := controlPlane.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx(t),
			&authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			return false, err.Error()
		}
		return r.Status.Allowed, r.Status.Reason
	})
}

// ruleAttributes is a request that rule allows (its first group, resource and verb).
func ruleAttributes(ns string, r rbacv1.PolicyRule) authorizationv1.SubjectAccessReviewSpec {
	if len(r.Resources) == 0 {
		return authorizationv1.SubjectAccessReviewSpec{NonResourceAttributes: &authorizationv1.NonResourceAttributes{
			Path: r.NonResourceURLs[0], Verb: r.Verbs[0]}}
	}
	resource, sub, _ := strings.Cut(r.Resources[0], "/")
	return authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
		Namespace: ns, Group: r.APIGroups[0], Resource: resource, Subresource: sub, Verb: r.Verbs[0]}}
}

// runAblation runs the scheduler under a fresh ServiceAccount with a's rules through the
// workload and returns the signals that something failed (none: everything worked).
func runAblation(t *testing.T, a ablation, sh ablationShared) []string {
	t.Helper()
	id := a.id
	ns := namespace(t, "sched-"+id)
	c := controlPlane.admin
	const sa = "devicelet-scheduler"
	user := "system:serviceaccount:" + ns + ":" + sa
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}
	createClusterRBAC(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "devicelet-" + id}, Rules: a.cluster},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "devicelet-" + id},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "devicelet-" + id},
			Subjects: subjects})
	if _, err := c.RbacV1().Roles(ns).Create(ctx(t), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "lease"}, Rules: a.lease}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx(t), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "lease"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "lease"},
		Subjects: subjects}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Both roles in force (one rule of each that is still there) before the scheduler starts.
	if len(a.cluster) > 0 {
		waitForAllowed(t, user, ruleAttributes("", a.cluster[len(a.cluster)-1]))
	}
	if len(a.lease) > 0 {
		waitForAllowed(t, user, ruleAttributes(ns, a.lease[len(a.lease)-1]))
	}

	w := newDeployWorkload(t, ns, id, id, ns, "devicelet-scheduler")
	secure := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	proc, addr := startSchedulerProcess(t, "devicelet scheduler "+id, serviceAccountKubeconfig(t, ns, sa),
		"--config", w.config(t), "--secure-address", secure)
	var signals []string
	if err := schedulerReady(proc, addr, 10*time.Second); err != nil {
		signals = append(signals, "never ready: "+err.Error())
	} else {
		if err := w.run(t, 12*time.Second); err != nil {
			signals = append(signals, "workload: "+err.Error())
		}
		if problems := securePortProblems(secure, sh.unbound, sh.unboundUser, sh.reader); len(problems) > 0 {
			signals = append(signals, "secure port: "+strings.Join(problems, "; "))
		}
	}
	if lines := forbiddenLines(proc.output.String()); len(lines) > 0 {
		signals = append(signals, fmt.Sprintf("log: %d forbidden lines, first: %.300s", len(lines), strings.TrimSpace(lines[0])))
	}
	for _, s := range signals {
		t.Logf("%s: %s", a.name, s)
	}
	return signals
}
