package cluster

// API-server faults a node agent lives through (issue 18): a storm of 429 and 5xx answers, and
// an identity the API server denies. devicelet talks to the real kube-apiserver through a
// fault-injecting TLS proxy owned by the test (it presents a certificate from the cluster's CA
// and forwards with the node's own client certificate), so the faults are real HTTP answers on
// a real connection.

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// faultProxy forwards to kube-apiserver; while `storm` is on it answers every request itself
// with 429 (Retry-After: 1), 500 or 503 in turn. `hold`, when set, is called with every request
// before it is forwarded and may block it.
type faultProxy struct {
	url      string
	storm    atomic.Bool
	answered atomic.Int64
	hold     atomic.Pointer[func(*http.Request)]
}

func readPEM(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	return block.Bytes
}

// startFaultProxy starts a proxy to the API server that authenticates upstream as node `name`
// (its certificate from node.sh).
func startFaultProxy(t *testing.T, name string) *faultProxy {
	t.Helper()
	return startFaultProxyAs(t, "node-"+name)
}

// startFaultProxyAs starts a proxy to the API server that authenticates upstream with the
// client certificate pki/CERT.crt (and serves with a certificate for that key).
func startFaultProxyAs(t *testing.T, cert string) *faultProxy {
	t.Helper()
	pki := filepath.Join(controlPlane.state, "pki")
	caCert, err := x509.ParseCertificate(readPEM(t, filepath.Join(pki, "ca.crt")))
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := x509.ParsePKCS8PrivateKey(readPEM(t, filepath.Join(pki, "ca.key")))
	if err != nil {
		t.Fatal(err)
	}
	serverKey, err := x509.ParsePKCS8PrivateKey(readPEM(t, filepath.Join(pki, cert+".key")))
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "devicelet-test-fault-proxy"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, caCert, serverKey.(crypto.Signer).Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	upstreamCert, err := tls.LoadX509KeyPair(filepath.Join(pki, cert+".crt"), filepath.Join(pki, cert+".key"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	target, err := url.Parse(apiServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	forward.FlushInterval = -1 // watches stream
	forward.Transport = &http.Transport{
		TLSClientConfig:   &tls.Config{Certificates: []tls.Certificate{upstreamCert}, RootCAs: roots},
		ForceAttemptHTTP2: true,
	}
	p := &faultProxy{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hold := p.hold.Load(); hold != nil {
			(*hold)(r)
		}
		if !p.storm.Load() {
			forward.ServeHTTP(w, r)
			return
		}
		n := p.answered.Add(1)
		code := []int{http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusServiceUnavailable}[n%3]
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected by the test","code":%d}`, code)
	})
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &http.Server{
		Handler: handler,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{
			Certificate: [][]byte{der},
			PrivateKey:  serverKey,
		}}},
	}
	go func() { _ = server.ServeTLS(listener, "", "") }()
	t.Cleanup(func() { _ = server.Close() })
	p.url = "https://" + listener.Addr().String()
	return p
}

func apiServerURL(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(controlPlane.state, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`server:\s*(\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("admin kubeconfig has no server")
	}
	return string(m[1])
}

// viaProxy writes a copy of kubeconfig whose server is the proxy.
func viaProxy(t *testing.T, kubeconfig, proxyURL string) string {
	t.Helper()
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	out := regexp.MustCompile(`server:\s*\S+`).ReplaceAll(data, []byte("server: "+proxyURL))
	path := kubeconfig + ".proxy"
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// apiErrors sums devicelet_api_server_errors_total{reason=REASON} from the node's metrics.
func apiErrors(t *testing.T, metricsAddr, reason string) int {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	total := 0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "devicelet_api_server_errors_total{") || !strings.Contains(line, `reason="`+reason+`"`) {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		total += int(v)
	}
	return total
}

// A storm of 429/500/503 answers for 20 s while pods are created: devicelet keeps running,
// counts the failures by reason, backs off (a bounded number of requests), and once the storm
// is over every pod is Running (the ones created during the storm too), the Lease is renewed
// and the Node is Ready.
func TestAPIServerErrorStorm(t *testing.T) {
	const name = "storm"
	kubeconfig := mintNodeKubeconfig(t, name, "")
	proxy := startFaultProxy(t, name)
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	n := startNodeWith(t, name, viaProxy(t, kubeconfig, proxy.url), "--metrics-address", metrics)
	n.plugin(t, "--devices", "4")
	waitForResource(t, name, gpu, 4, 4)
	ns := namespace(t, "storm")
	createDeployment(t, ns, "app", name, 2, 1)
	waitForRunning(t, ns, "app", 2, 90*time.Second)

	proxy.storm.Store(true)
	stormStart := time.Now()
	scaleDeployment(t, ns, "app", 4)
	time.Sleep(20 * time.Second)
	proxy.storm.Store(false)
	stormRequests := proxy.answered.Load()
	select {
	case <-n.devicelet.exited:
		t.Fatalf("devicelet exited during the storm:\n%s", lastLines(n.devicelet.output.String(), 40))
	default:
	}
	// Back-off, not a hot loop: a few requests a second at most over the storm.
	if perSecond := float64(stormRequests) / time.Since(stormStart).Seconds(); stormRequests == 0 || perSecond > 20 {
		t.Fatalf("%d requests during the 20 s storm (%.1f/s): want some, with back-off", stormRequests, perSecond)
	}
	waitForRunning(t, ns, "app", 4, 120*time.Second)
	// kube-rs retries 429 and 503 itself (as client-go honours Retry-After); what still fails
	// after its retries is counted by reason.
	throttled, serverErrors := apiErrors(t, metrics, "throttled"), apiErrors(t, metrics, "server_error")
	if serverErrors == 0 {
		t.Fatalf("devicelet_api_server_errors_total: throttled %d, server_error %d; want the failures counted", throttled, serverErrors)
	}
	stormEnd := time.Now()
	waitFor(t, 30*time.Second, "the Lease renewed after the storm", func() (bool, string) {
		l, err := controlPlane.admin.CoordinationV1().Leases("kube-node-lease").Get(ctx(t), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return l.Spec.RenewTime != nil && l.Spec.RenewTime.After(stormEnd), fmt.Sprint(l.Spec.RenewTime)
	})
	if _, _, ready := resourceOf(t, name, gpu); !ready {
		t.Fatal("node not Ready after the storm")
	}
	t.Logf("storm: %d requests answered with faults in 20 s; counted throttled=%d server_error=%d", stormRequests, throttled, serverErrors)
}

// An identity the API server denies (a certificate for system:node:NAME outside the
// system:nodes group: neither the Node authorizer nor RBAC allows it anything): devicelet keeps
// running, says which identity it needs, counts the denials, and retries with back-off instead
// of a crash loop or a hot loop.
func TestDeniedIdentity(t *testing.T) {
	const name = "denied"
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	n := startNodeWith(t, name, mintNodeKubeconfig(t, name, "devicelet-test-not-nodes"), "--metrics-address", metrics)
	time.Sleep(20 * time.Second)
	select {
	case <-n.devicelet.exited:
		t.Fatalf("devicelet exited:\n%s", lastLines(n.devicelet.output.String(), 40))
	default:
	}
	out := n.devicelet.output.String()
	if !strings.Contains(out, "denied the node identity") || !strings.Contains(out, "system:node:"+name) {
		t.Fatalf("no clear log line about the denied identity:\n%s", lastLines(out, 30))
	}
	denied := apiErrors(t, metrics, "denied")
	if denied == 0 || denied > 100 {
		t.Fatalf("devicelet_api_server_errors_total{reason=denied} = %d over 20 s; want some, with back-off", denied)
	}
	if _, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{}); err == nil {
		t.Fatal("a denied identity registered a Node")
	}
}
