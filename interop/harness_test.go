// Package interop drives a real devicelet binary with upstream Kubernetes Go clients and
// servers (k8s.io/kubelet v0.36 API types, google.golang.org/grpc), the way unmodified device
// plugins and monitoring agents talk to a kubelet.
//
// This file holds the harness: finding the binary, starting `devicelet serve` on a temporary
// root directory, and reading `devicelet get resources -o json`.
package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// envBin names the devicelet binary (absolute path).
	envBin = "DEVICELET_BIN"
	// envOptional=1 turns "no binary" / "feature not served" into a skip instead of a failure.
	envOptional = "DEVICELET_INTEROP_OPTIONAL"

	startupTimeout = 20 * time.Second
	commandTimeout = 15 * time.Second
)

// deviceletBinary returns the binary from DEVICELET_BIN, failing (or skipping when
// DEVICELET_INTEROP_OPTIONAL=1) when it is not usable.
func deviceletBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(envBin)
	if bin == "" {
		skipOrFail(t, "%s is not set: build devicelet (cargo build -p devicelet) and set %s to its absolute path, or run interop/run.sh", envBin, envBin)
	}
	if !filepath.IsAbs(bin) {
		t.Fatalf("%s=%q must be an absolute path", envBin, bin)
	}
	info, err := os.Stat(bin)
	if err != nil {
		skipOrFail(t, "%s=%q: %v", envBin, bin, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		t.Fatalf("%s=%q is not an executable file", envBin, bin)
	}
	return bin
}

// skipOrFail skips the test with the message when DEVICELET_INTEROP_OPTIONAL=1 and fails it
// otherwise.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(envOptional) == "1" {
		t.Skipf("skipped (%s=1): %s", envOptional, msg)
	}
	t.Fatal(msg)
}

// shortTempDir makes a temporary directory with a short path: Unix socket paths are limited to
// 108 bytes, and t.TempDir() embeds the (long) test name.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dli-")
	if err != nil {
		t.Fatalf("creating temp dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
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

// devicelet is one running `devicelet serve` process.
type devicelet struct {
	bin     string
	root    string
	cmd     *exec.Cmd
	output  *lockedBuffer
	exited  chan struct{}
	exitErr error
}

// kubeletSocket is R/device-plugins/kubelet.sock.
func (d *devicelet) kubeletSocket() string {
	return filepath.Join(d.root, "device-plugins", "kubelet.sock")
}

// pluginDir is R/device-plugins, where plugins put their sockets.
func (d *devicelet) pluginDir() string {
	return filepath.Join(d.root, "device-plugins")
}

// startDevicelet runs `devicelet serve --root-dir <tmp>` and waits for kubelet.sock to appear.
// The process gets SIGTERM at the end of the test.
func startDevicelet(t *testing.T) *devicelet {
	t.Helper()
	return startDeviceletAt(t, shortTempDir(t))
}

// startDeviceletAt is startDevicelet on an existing root directory (a restart).
func startDeviceletAt(t *testing.T, root string) *devicelet {
	t.Helper()
	return startDeviceletWith(t, root)
}

// startDeviceletWith is startDeviceletAt with extra `serve` arguments (e.g. --config FILE).
func startDeviceletWith(t *testing.T, root string, serveArgs ...string) *devicelet {
	t.Helper()
	bin := deviceletBinary(t)
	d := &devicelet{bin: bin, root: root, output: &lockedBuffer{}, exited: make(chan struct{})}
	d.cmd = exec.Command(bin, append([]string{"serve", "--root-dir", root}, serveArgs...)...)
	d.cmd.Stdout = d.output
	d.cmd.Stderr = d.output
	d.cmd.Env = append(os.Environ(), "RUST_LOG="+envOr("RUST_LOG", "info"), "NO_COLOR=1")
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("starting %s serve: %v", bin, err)
	}
	go func() {
		d.exitErr = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() { d.stop(t) })

	deadline := time.Now().Add(startupTimeout)
	for {
		if isSocket(d.kubeletSocket()) {
			return d
		}
		select {
		case <-d.exited:
			t.Fatalf("devicelet serve exited before creating %s: %v\noutput:\n%s", d.kubeletSocket(), d.exitErr, d.output)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("devicelet serve did not create %s within %s\noutput:\n%s", d.kubeletSocket(), startupTimeout, d.output)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits (then SIGKILL) so no daemon outlives the test. It is safe to call
// more than once.
func (d *devicelet) stop(t *testing.T) {
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
		t.Errorf("devicelet serve did not stop within 10s of SIGTERM\noutput:\n%s", d.output)
	}
	if t.Failed() {
		t.Logf("devicelet serve output:\n%s", d.output)
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func isSocket(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode()&os.ModeSocket != 0
}

// run executes `devicelet --root-dir R <args...>` and returns stdout, stderr and the error.
func (d *devicelet) run(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	full := append([]string{"--root-dir", d.root}, args...)
	cmd := exec.CommandContext(ctx, d.bin, full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// resourceList is the JSON of `devicelet get resources -o json` (DESIGN.md command contract).
type resourceList struct {
	Resources []resourceEntry `json:"resources"`
}

type resourceEntry struct {
	Name        string          `json:"name"`
	Capacity    json.RawMessage `json:"capacity"`
	Allocatable json.RawMessage `json:"allocatable"`
	Inactive    json.RawMessage `json:"inactive"`
	Devices     []deviceEntry   `json:"devices"`
}

type deviceEntry struct {
	ID        string  `json:"id"`
	Health    string  `json:"health"`
	NUMANodes []int64 `json:"numaNodes"`
}

// quantity reads a count that may be a JSON number or a decimal string ("4").
func quantity(raw json.RawMessage) (int64, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return 0, fmt.Errorf("missing")
	}
	if unquoted, err := strconv.Unquote(s); err == nil {
		s = unquoted
	}
	return strconv.ParseInt(s, 10, 64)
}

// getResources runs `devicelet get resources -o json` and decodes it.
func (d *devicelet) getResources() (resourceList, error) {
	stdout, stderr, err := d.run("get", "resources", "-o", "json")
	if err != nil {
		return resourceList{}, fmt.Errorf("devicelet get resources: %v\nstderr: %s", err, stderr)
	}
	var list resourceList
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		return resourceList{}, fmt.Errorf("decoding get resources output %q: %v", stdout, err)
	}
	return list, nil
}

// findResource returns the named entry of a resource list.
func (l resourceList) findResource(name string) (resourceEntry, bool) {
	for _, r := range l.Resources {
		if r.Name == name {
			return r, true
		}
	}
	return resourceEntry{}, false
}

// waitForResource polls `get resources` until check accepts the named resource or the timeout
// passes, and returns the last problem seen.
func (d *devicelet) waitForResource(name string, timeout time.Duration, check func(resourceEntry) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		list, err := d.getResources()
		switch {
		case err != nil:
			last = err
		default:
			if r, ok := list.findResource(name); !ok {
				last = fmt.Errorf("resource %q not listed; got %+v", name, list.Resources)
			} else if err := check(r); err != nil {
				last = err
			} else {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return last
		}
		time.Sleep(100 * time.Millisecond)
	}
}
