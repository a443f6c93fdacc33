// Kubelet TLS bootstrap (issue 29): devicelet joins with a bootstrap token instead of a
// certificate minted with the CA's key. It makes a CertificateSigningRequest for
// system:node:NAME (signer kubernetes.io/kube-apiserver-client-kubelet), which
// kube-controller-manager's csrapproving controller approves because of the RBAC bindings
// kubeadm creates, and its csrsigning controller issues; devicelet writes the key and
// certificate (0600) and the kubeconfig, joins as the node, and rotates the certificate with
// its own identity (selfnodeclient). A request nobody approves, or one that is denied, ends
// with a clear message within the wait devicelet was given.
package cluster

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// The group kubeadm gives its default bootstrap tokens, bound to CSR creation and automatic
// approval of node client certificates.
const kubeadmBootstrapGroup = "system:bootstrappers:kubeadm:default-node-token"

// A group only allowed to create requests: nothing approves them automatically.
const manualBootstrapGroup = "system:bootstrappers:devicelet-test:manual"

// kubeadmBootstrapRBAC creates the bindings `kubeadm init` creates for TLS bootstrap.
func kubeadmBootstrapRBAC(t *testing.T) {
	t.Helper()
	bindings := []struct{ name, role, group string }{
		{"kubeadm:kubelet-bootstrap", "system:node-bootstrapper", kubeadmBootstrapGroup},
		{"kubeadm:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", kubeadmBootstrapGroup},
		{"kubeadm:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes"},
		{"devicelet-test:manual-bootstrap", "system:node-bootstrapper", manualBootstrapGroup},
	}
	for _, b := range bindings {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: b.group}},
		}
		_, err := controlPlane.admin.RbacV1().ClusterRoleBindings().Create(ctx(t), crb, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create ClusterRoleBinding %s: %v", b.name, err)
		}
	}
}

// bootstrapToken creates a bootstrap token Secret for `group` (as `kubeadm token create`
// does) and returns its id and a bootstrap kubeconfig using it.
func bootstrapToken(t *testing.T, group string) (id, kubeconfig string) {
	t.Helper()
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	random := func(n int) string {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		for i := range b {
			b[i] = alphabet[int(b[i])%len(alphabet)]
		}
		return string(b)
	}
	id, secret := random(6), random(16)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: "kube-system"},
		Type:       "bootstrap.kubernetes.io/token",
		StringData: map[string]string{
			"token-id":                       id,
			"token-secret":                   secret,
			"usage-bootstrap-authentication": "true",
			"auth-extra-groups":              group,
			"expiration":                     time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		},
	}
	if _, err := controlPlane.admin.CoreV1().Secrets("kube-system").Create(ctx(t), s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create bootstrap token: %v", err)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.CoreV1().Secrets("kube-system").Delete(ctx(t), s.Name, metav1.DeleteOptions{})
	})
	admin, err := clientcmd.BuildConfigFromFlags("", filepath.Join(controlPlane.state, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig = filepath.Join(shortTempDir(t), "bootstrap.kubeconfig")
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: bootstrap
  user: {token: %q}
contexts:
- name: bootstrap
  context: {cluster: test, user: bootstrap}
current-context: bootstrap
`, admin.Host, filepath.Join(controlPlane.state, "pki", "ca.crt"), id+"."+secret)
	if err := os.WriteFile(kubeconfig, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return id, kubeconfig
}

// csrsFrom lists the CertificateSigningRequests made by `username`.
func csrsFrom(t *testing.T, username string) []certificatesv1.CertificateSigningRequest {
	t.Helper()
	list, err := controlPlane.admin.CertificatesV1().CertificateSigningRequests().List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list CSRs: %v", err)
	}
	var out []certificatesv1.CertificateSigningRequest
	for _, csr := range list.Items {
		if csr.Spec.Username == username {
			out = append(out, csr)
		}
	}
	return out
}

func approved(csr certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// storedCertificate reads R/pki/kubelet-client-current.pem: it must be a 0600 file holding the
// certificate and its key.
func storedCertificate(t *testing.T, root string) (*x509.Certificate, string) {
	t.Helper()
	link := filepath.Join(root, "pki", "kubelet-client-current.pem")
	target, err := os.Readlink(link)
	if err != nil {
		t.Fatalf("%s is not a link: %v", link, err)
	}
	info, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("%s has mode %v, want 0600", target, info.Mode().Perm())
	}
	data, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "PRIVATE KEY-----") {
		t.Fatalf("%s holds no private key", target)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s does not start with a certificate", target)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert, target
}

func nodeReady(t *testing.T, name string) (bool, string) {
	nd, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	for _, c := range nd.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, string(c.Status)
		}
	}
	return false, "no Ready condition"
}

// TestTLSBootstrapJoinsAndRotates: a bootstrap token and kubeadm's RBAC are all a node needs.
func TestTLSBootstrapJoinsAndRotates(t *testing.T) {
	kubeadmBootstrapRBAC(t)
	id, bootstrapKubeconfig := bootstrapToken(t, kubeadmBootstrapGroup)
	const name = "boot-1"
	kubeconfig := filepath.Join(shortTempDir(t), "node.kubeconfig")
	// The test hook rotates 8 s after each certificate is obtained (real rotation: at 70-90 %
	// of a year, kube-controller-manager's default signing duration).
	t.Setenv("DEVICELET_CERT_ROTATE_AFTER", "8s")
	started := time.Now()
	n := startNodeWith(t, name, kubeconfig, "--bootstrap-kubeconfig", bootstrapKubeconfig,
		"--rotate-certificates", "--bootstrap-timeout", "60s", "--capacity", "cpu=3,memory=5Gi,pods=20")
	waitFor(t, 60*time.Second, "node "+name+" Ready", func() (bool, string) { return nodeReady(t, name) })
	t.Logf("bootstrap to Ready: %v", time.Since(started).Round(time.Millisecond))

	// --capacity: the machine this simulated node advertises, not the host's.
	nd, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := nd.Status.Capacity; c.Cpu().Value() != 3 || c.Memory().Value() != 5<<30 || c.Pods().Value() != 20 {
		t.Fatalf("capacity %v, want cpu 3, memory 5Gi, pods 20", c)
	}
	// Pods come from the API server: a local admission is refused.
	admit := exec.Command(os.Getenv("DEVICELET_BIN"), "--root-dir", n.root, "admit", "-f", "-")
	admit.Stdin = strings.NewReader(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default","uid":"u-1"},"spec":{"containers":[{"name":"c","image":"x"}]}}`)
	out, err := admit.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "admit is refused in cluster mode") {
		t.Fatalf("local admit in cluster mode: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"remove", "u-1"}, {"sync-pods", "--none"}} {
		out, err := exec.Command(os.Getenv("DEVICELET_BIN"), append([]string{"--root-dir", n.root}, args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), args[0]+" is refused in cluster mode") {
			t.Fatalf("local %s in cluster mode: %v\n%s", args[0], err, out)
		}
	}

	// One request from the bootstrap identity, approved and issued.
	first := csrsFrom(t, "system:bootstrap:"+id)
	if len(first) != 1 || !approved(first[0]) || len(first[0].Status.Certificate) == 0 {
		t.Fatalf("want one approved and issued CSR from the bootstrap token, got %+v", first)
	}
	if first[0].Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
		t.Fatalf("signer %q", first[0].Spec.SignerName)
	}
	cert, firstFile := storedCertificate(t, n.root)
	if cert.Subject.CommonName != "system:node:"+name || strings.Join(cert.Subject.Organization, ",") != "system:nodes" {
		t.Fatalf("certificate subject %v", cert.Subject)
	}
	info, err := os.Stat(kubeconfig)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %s: %v mode %v", kubeconfig, err, info)
	}

	// The identity is the node's: it publishes its devices.
	n.plugin(t, "--resource", "example.com/gpu", "--devices", "2")
	waitForResource(t, name, "example.com/gpu", 2, 2)

	// Rotation: a request from the node itself, approved through selfnodeclient, a new file,
	// the link moved; the node keeps working on the new certificate.
	waitFor(t, 60*time.Second, "a rotated certificate", func() (bool, string) {
		own := csrsFrom(t, "system:node:"+name)
		for _, csr := range own {
			if approved(csr) && len(csr.Status.Certificate) > 0 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d requests from the node", len(own))
	})
	waitFor(t, 20*time.Second, "the store's link to move", func() (bool, string) {
		_, file := storedCertificate(t, n.root)
		return file != firstFile, file
	})
	waitFor(t, 20*time.Second, "devicelet to log the rotation", func() (bool, string) {
		return strings.Contains(n.devicelet.output.String(), "client certificate rotated"), ""
	})
	stop := n.plugin(t, "--resource", "example.com/nic", "--devices", "1")
	waitForResource(t, name, "example.com/nic", 1, 1)
	stop.stop()

	// A restart keeps the stored certificate: no new bootstrap request.
	n.devicelet.stop()
	os.Unsetenv("DEVICELET_CERT_ROTATE_AFTER")
	n.start(t)
	waitFor(t, 30*time.Second, "node "+name+" Ready after a restart", func() (bool, string) { return nodeReady(t, name) })
	if got := csrsFrom(t, "system:bootstrap:"+id); len(got) != 1 {
		t.Fatalf("a restart made a new bootstrap request: %d", len(got))
	}
	if !strings.Contains(n.devicelet.output.String(), "using the node's kubeconfig") {
		t.Fatalf("restart did not reuse the kubeconfig:\n%s", lastLines(n.devicelet.output.String(), 20))
	}
}

// TestTLSBootstrapUnapprovedAndDenied: nothing approves a request from the manual group. A
// short wait ends with a message naming the request and what to do; a restart continues the
// same request (same key), which an administrator approves; a denied request ends at once.
func TestTLSBootstrapUnapprovedAndDenied(t *testing.T) {
	kubeadmBootstrapRBAC(t)
	id, bootstrapKubeconfig := bootstrapToken(t, manualBootstrapGroup)
	const name = "boot-manual"
	root := shortTempDir(t)
	kubeconfig := filepath.Join(shortTempDir(t), "node.kubeconfig")
	serve := func(wait string) *process {
		return startProcess(t, "devicelet "+name, "serve", "--root-dir", root, "--node-name", name,
			"--metrics-address", "off", "--kubeconfig", kubeconfig,
			"--bootstrap-kubeconfig", bootstrapKubeconfig, "--bootstrap-timeout", wait)
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.CoreV1().Nodes().Delete(ctx(t), name, metav1.DeleteOptions{})
	})

	started := time.Now()
	p := serve("3s")
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("devicelet did not give up within 30 s with --bootstrap-timeout 3s")
	}
	took := time.Since(started)
	out := p.output.String()
	pending := csrsFrom(t, "system:bootstrap:"+id)
	if len(pending) != 1 || approved(pending[0]) {
		t.Fatalf("want one pending CSR, got %+v", pending)
	}
	csrName := pending[0].Name
	if p.cmd.ProcessState.ExitCode() != 1 ||
		!strings.Contains(out, "CertificateSigningRequest "+csrName+" was not approved within 3 s") ||
		!strings.Contains(out, "kubectl certificate approve") {
		t.Fatalf("exit %d after %v:\n%s", p.cmd.ProcessState.ExitCode(), took, lastLines(out, 10))
	}
	t.Logf("unapproved: gave up after %v: %s", took.Round(time.Millisecond), lastLines(out, 1))

	// A restart continues the same request; an administrator approves it; the node joins.
	p = serve("60s")
	waitFor(t, 20*time.Second, "devicelet to continue its request", func() (bool, string) {
		return strings.Contains(p.output.String(), "continuing the CertificateSigningRequest"), ""
	})
	if got := csrsFrom(t, "system:bootstrap:"+id); len(got) != 1 {
		t.Fatalf("a restart made another request: %d", len(got))
	}
	csr := pending[0]
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: "AdminApproved", Message: "approved by the test",
	})
	if _, err := controlPlane.admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx(t), csrName, &csr, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("approve %s: %v", csrName, err)
	}
	waitFor(t, 60*time.Second, "node "+name+" Ready", func() (bool, string) { return nodeReady(t, name) })
	p.stop()

	// A denied request: devicelet stops waiting at once and says so.
	id2, bootstrap2 := bootstrapToken(t, manualBootstrapGroup)
	root2 := shortTempDir(t)
	p = startProcess(t, "devicelet boot-denied", "serve", "--root-dir", root2, "--node-name", "boot-denied",
		"--metrics-address", "off", "--kubeconfig", filepath.Join(root2, "node.kubeconfig"),
		"--bootstrap-kubeconfig", bootstrap2, "--bootstrap-timeout", "60s")
	var denied certificatesv1.CertificateSigningRequest
	waitFor(t, 20*time.Second, "the second request", func() (bool, string) {
		got := csrsFrom(t, "system:bootstrap:"+id2)
		if len(got) == 1 {
			denied = got[0]
			return true, ""
		}
		return false, fmt.Sprint(len(got))
	})
	denied.Status.Conditions = append(denied.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue,
		Reason: "TestDenied", Message: "not this node",
	})
	deniedAt := time.Now()
	if _, err := controlPlane.admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx(t), denied.Name, &denied, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("deny: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("devicelet kept waiting on a denied request")
	}
	out = p.output.String()
	if p.cmd.ProcessState.ExitCode() != 1 || !strings.Contains(out, "was denied (TestDenied: not this node)") {
		t.Fatalf("exit %d:\n%s", p.cmd.ProcessState.ExitCode(), lastLines(out, 10))
	}
	t.Logf("denied: exited %v after the denial", time.Since(deniedAt).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(root2, "node.kubeconfig")); !os.IsNotExist(err) {
		t.Fatalf("a kubeconfig was written for a denied node: %v", err)
	}
}
