// Package cluster runs devicelet as the device half of Kubernetes nodes against a real control
// plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler built from the
// k8s.io/kubernetes Go modules by build.sh, started by up.sh on 127.0.0.1).
//
// devicelet always runs with a node identity (system:node:NAME in system:nodes, minted by
// node.sh) under --authorization-mode=Node,RBAC and NodeRestriction; the tests use the admin
// identity only for what a user or the control plane would do (create a Deployment, delete a
// Node, force-delete a pod).
//
// This file holds the harness: the control plane for the whole package, devicelet and
// example-plugin processes, and polling helpers.
package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// controlPlane is the package's control plane, started once by TestMain.
var controlPlane struct {
	state string // up.sh's STATE_DIR
	bin   string // build.sh's binaries
	admin *kubernetes.Clientset
}

func TestMain(m *testing.M) {
	os.Exit(runWithControlPlane(m))
}

func runWithControlPlane(m *testing.M) int {
	if os.Getenv("DEVICELET_BIN") == "" {
		fmt.Fprintln(os.Stderr, "cluster: DEVICELET_BIN is not set (run interop/cluster/run.sh)")
		return 1
	}
	state, err := os.MkdirTemp("", "dlc-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		return 1
	}
	defer os.RemoveAll(state)
	up := exec.Command("bash", "up.sh", state, os.Getenv("DEVICELET_TEST_CONTROLPLANE_BIN"))
	up.Stdout, up.Stderr = os.Stderr, os.Stderr
	if err := up.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster: up.sh failed:", err)
		return 1
	}
	stopAll := func() {
		children.killAll()
		down := exec.Command("bash", "down.sh", state)
		down.Stdout, down.Stderr = os.Stderr, os.Stderr
		_ = down.Run()
	}
	defer stopAll()
	// An outer timeout (run.sh, CI) sends SIGTERM: stop the control plane and every child
	// instead of leaving them running (the control plane runs in its own sessions).
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-signals
		fmt.Fprintf(os.Stderr, "cluster: %v: stopping the control plane and every devicelet\n", s)
		stopAll()
		os.RemoveAll(state)
		os.Exit(2)
	}()
	controlPlane.state = state
	controlPlane.bin = os.Getenv("DEVICELET_TEST_CONTROLPLANE_BIN")
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(state, "admin.kubeconfig"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster: admin kubeconfig:", err)
		return 1
	}
	cfg.QPS, cfg.Burst = 200, 400
	controlPlane.admin = kubernetes.NewForConfigOrDie(cfg)
	// Pods are refused until the service-account controller made the namespace's default
	// ServiceAccount.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for {
		_, err := controlPlane.admin.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "cluster: the default ServiceAccount never appeared:", err)
			return 1
		}
		time.Sleep(250 * time.Millisecond)
	}
	code := m.Run()
	if code != 0 {
		for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			tailLog(filepath.Join(state, "logs", name+".log"), 15)
		}
	}
	return code
}

func tailLog(path string, n int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	fmt.Fprintf(os.Stderr, "--- last lines of %s\n%s\n", path, lastLines(string(data), n))
}

// lockedBuffer collects a child's output for failure messages.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// childSet holds every child process the tests started, so a signal can stop them all.
type childSet struct {
	mu    sync.Mutex
	procs map[*exec.Cmd]struct{}
}

var children = childSet{procs: map[*exec.Cmd]struct{}{}}

func (c *childSet) add(cmd *exec.Cmd) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs[cmd] = struct{}{}
}

func (c *childSet) remove(cmd *exec.Cmd) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.procs, cmd)
}

func (c *childSet) killAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cmd := range c.procs {
		_ = cmd.Process.Kill()
	}
}

// process is a child (devicelet serve, an example plugin) with its output kept.
type process struct {
	name   string
	cmd    *exec.Cmd
	output *lockedBuffer
	exited chan struct{}
}

func startProcess(t *testing.T, name string, args ...string) *process {
	t.Helper()
	return startProgram(t, name, os.Getenv("DEVICELET_BIN"), args...)
}

// startProgram runs `bin` as a tracked child: output kept, stopped at the end of the test (and
// on a signal), its last lines logged if the test failed.
func startProgram(t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	// devicelet's per-pod start-up record is a debug line (the scale tests read it).
	return startProgramEnv(t, name, bin, []string{"RUST_LOG=info,devicelet_kube::startup=debug", "NO_COLOR=1"}, args...)
}

// startProgramEnv is startProgram with `env` added to this process's environment.
func startProgramEnv(t *testing.T, name, bin string, env []string, args ...string) *process {
	t.Helper()
	p := &process{name: name, output: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	children.add(p.cmd)
	go func() {
		_ = p.cmd.Wait()
		children.remove(p.cmd)
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- output of %s:\n%s", p.name, lastLines(p.output.String(), 60))
		}
		// CLUSTER_OUTPUT_DIR keeps every process's whole output, for debugging a run.
		if dir := os.Getenv("CLUSTER_OUTPUT_DIR"); dir != "" {
			file := filepath.Join(dir, fmt.Sprintf("%s-%d.log", strings.NewReplacer(" ", "_", "/", "_", "(", "", ")", "", ",", "").Replace(p.name), p.cmd.Process.Pid))
			_ = os.WriteFile(file, []byte(p.output.String()), 0o644)
		}
	})
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stop sends SIGTERM and waits (SIGKILL after 10 s).
func (p *process) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// node is one devicelet process joined to the cluster as Node `name`.
type node struct {
	name       string
	root       string
	kubeconfig string
	serveArgs  []string
	devicelet  *process
}

// shortTempDir makes a temporary directory with a short path (Unix socket paths are limited to
// 108 bytes).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dln-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// startNode mints a node identity for `name` and runs `devicelet serve --kubeconfig` with it.
// The Node object is deleted at the end of the test.
func startNode(t *testing.T, name string, serveArgs ...string) *node {
	t.Helper()
	return startNodeWith(t, name, mintNodeKubeconfig(t, name, ""), serveArgs...)
}

// mintNodeKubeconfig runs node.sh: a client certificate for system:node:NAME in `group`
// ("": system:nodes) and a kubeconfig using it.
func mintNodeKubeconfig(t *testing.T, name, group string) string {
	t.Helper()
	args := []string{"node.sh", controlPlane.state, name}
	if group != "" {
		args = append(args, group)
	}
	out, err := exec.Command("bash", args...).Output()
	if err != nil {
		t.Fatalf("node.sh %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// startNodeWith runs `devicelet serve` for node `name` with `kubeconfig`.
func startNodeWith(t *testing.T, name, kubeconfig string, serveArgs ...string) *node {
	t.Helper()
	n := &node{
		name:       name,
		root:       shortTempDir(t),
		kubeconfig: kubeconfig,
		serveArgs:  serveArgs,
	}
	t.Cleanup(func() {
		_ = controlPlane.admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	n.start(t)
	return n
}

// start runs devicelet serve for the node (again, after a kill).
func (n *node) start(t *testing.T) {
	t.Helper()
	args := []string{"serve", "--root-dir", n.root, "--kubeconfig", n.kubeconfig, "--node-name", n.name}
	if !slices.Contains(n.serveArgs, "--metrics-address") {
		args = append(args, "--metrics-address", "off")
	}
	args = append(args, n.serveArgs...)
	n.devicelet = startProcess(t, "devicelet "+n.name, args...)
	// The control socket is bound last (after kubelet.sock and PodResources); after a SIGKILL
	// the old socket files are still there, so only a successful connect means this run is up.
	sock := filepath.Join(n.root, "devicelet", "devicelet.sock")
	waitFor(t, 30*time.Second, "devicelet's control socket", func() (bool, string) {
		select {
		case <-n.devicelet.exited:
			t.Fatalf("devicelet %s exited:\n%s", n.name, lastLines(n.devicelet.output.String(), 40))
		default:
		}
		conn, err := net.Dial("unix", sock)
		if err == nil {
			conn.Close()
		}
		return err == nil, fmt.Sprint(err)
	})
}

// plugin runs the built-in example device plugin against the node.
func (n *node) plugin(t *testing.T, args ...string) *process {
	t.Helper()
	return startProcess(t, "example-plugin "+n.name,
		append([]string{"example-plugin", "--root-dir", n.root}, args...)...)
}

// cli runs a devicelet command against the node's root and returns stdout.
func (n *node) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Getenv("DEVICELET_BIN"), append([]string{"--root-dir", n.root}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("devicelet %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// waitFor polls cond every 200 ms until it holds; on timeout the test fails with what and the
// last state cond reported.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	waitForEvery(t, timeout, 200*time.Millisecond, what, cond)
}

// waitForEvery is waitFor polling every `interval` (large lists poll less often).
func waitForEvery(t *testing.T, timeout, interval time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
		}
		time.Sleep(interval)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// resourceOf returns the node's capacity and allocatable of `resource` (-1 when absent).
func resourceOf(t *testing.T, name, resource string) (capacity, allocatable int64, ready bool) {
	t.Helper()
	nd, err := controlPlane.admin.CoreV1().Nodes().Get(ctx(t), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return -1, -1, false
	}
	if err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	capacity, allocatable = -1, -1
	if q, ok := nd.Status.Capacity[corev1.ResourceName(resource)]; ok {
		capacity = q.Value()
	}
	if q, ok := nd.Status.Allocatable[corev1.ResourceName(resource)]; ok {
		allocatable = q.Value()
	}
	for _, c := range nd.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			ready = true
		}
	}
	return capacity, allocatable, ready
}

// waitForResource waits until the Node reports the resource's capacity and allocatable.
func waitForResource(t *testing.T, name, resource string, capacity, allocatable int64) {
	t.Helper()
	waitFor(t, 60*time.Second, fmt.Sprintf("node %s %s capacity %d allocatable %d", name, resource, capacity, allocatable),
		func() (bool, string) {
			c, a, ready := resourceOf(t, name, resource)
			return c == capacity && a == allocatable && ready,
				fmt.Sprintf("capacity %d allocatable %d ready %v", c, a, ready)
		})
}

// itoa formats an int for labels and names.
func itoa(i int) string { return strconv.Itoa(i) }
