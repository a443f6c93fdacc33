// Package checkpoint checks devicelet's device checkpoint (and, in resource_state_test.go, its
// cpu_manager_state and memory_manager_state) against the kubelet's own Go code:
// k8s.io/kubernetes v1.36 pkg/kubelet/checkpointmanager (which verifies the checksum on read and
// computes it on write) and pkg/kubelet/cm/devicemanager/checkpoint (the file's types), with the
// cached Allocate answers decoded as k8s.io/kubelet deviceplugin v1beta1
// ContainerAllocateResponse, as the kubelet's Device Manager does when it restores.
//
// This file holds the harness: the binary from DEVICELET_BIN, short temporary roots,
// `devicelet serve` and `devicelet example-plugin` as child processes, and the CLI.
package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	envBin = "DEVICELET_BIN"
	// waitTimeout bounds every wait for the daemon; generous because CI shares 2 cores with
	// other builds.
	waitTimeout    = 60 * time.Second
	commandTimeout = 60 * time.Second
	stopTimeout    = 20 * time.Second
	// checkpointFile is the kubelet's device checkpoint key (pkg/kubelet/cm/devicemanager
	// kubeletDeviceManagerCheckpoint), in R/device-plugins.
	checkpointFile = "kubelet_internal_checkpoint"
)

func deviceletBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(envBin)
	if bin == "" {
		t.Fatalf("%s is not set: build devicelet (cargo build -p devicelet) and run interop/checkpoint/run.sh", envBin)
	}
	if !filepath.IsAbs(bin) {
		t.Fatalf("%s=%q must be an absolute path", envBin, bin)
	}
	info, err := os.Stat(bin)
	if err != nil {
		t.Fatalf("%s=%q: %v", envBin, bin, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		t.Fatalf("%s=%q is not an executable file", envBin, bin)
	}
	return bin
}

// newRoot makes a temporary root directory with a short path (Unix socket paths are limited
// to 108 bytes): on /dev/shm when it is writable (the daemon fsyncs every admission; a tmpfs
// keeps those calls real without the shared disk's stalls), else in the default temp dir.
func newRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "dlck-")
	if err != nil {
		dir, err = os.MkdirTemp("", "dlck-")
	}
	if err != nil {
		t.Fatalf("creating a temporary root: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

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

// proc is a devicelet child process (serve or example-plugin).
type proc struct {
	name    string
	cmd     *exec.Cmd
	output  *lockedBuffer
	exited  chan struct{}
	exitErr error
}

// spawn starts `devicelet <args...> --root-dir root`. The process is stopped (SIGTERM, then
// SIGKILL) at the end of the test, and its output is logged when the test failed.
func spawn(t *testing.T, root, name string, env []string, args ...string) *proc {
	t.Helper()
	bin := deviceletBinary(t)
	p := &proc{name: name, output: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, append(args, "--root-dir", root)...)
	p.cmd.Stdout = p.output
	p.cmd.Stderr = p.output
	p.cmd.Env = append(append(os.Environ(), "RUST_LOG="+envOr("RUST_LOG", "info"), "NO_COLOR=1"), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting devicelet %s: %v", name, err)
	}
	go func() {
		p.exitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("devicelet %s output:\n%s", p.name, p.output)
		}
	})
	return p
}

// serve starts `devicelet serve --metrics-address off` on root and waits until the control
// API answers `get resources`.
func serve(t *testing.T, root string) *proc {
	t.Helper()
	p := spawn(t, root, "serve", nil, "serve", "--metrics-address", "off")
	waitFor(t, p, "the control API", func() bool {
		_, _, err := cli(t, root, "get", "resources", "-o", "json")
		return err == nil
	})
	return p
}

// examplePlugin starts `devicelet example-plugin` with the given flags.
func examplePlugin(t *testing.T, root string, args ...string) *proc {
	t.Helper()
	return spawn(t, root, "example-plugin "+fmt.Sprint(args), []string{"DEVICELET_EXAMPLE_PLUGIN_POLL_MS=20"},
		append([]string{"example-plugin"}, args...)...)
}

// terminate sends SIGTERM and waits for a clean exit (status 0).
func (p *proc) terminate(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		p.kill()
		t.Fatalf("devicelet %s did not stop within %s of SIGTERM\noutput:\n%s", p.name, stopTimeout, p.output)
	}
	if p.exitErr != nil {
		t.Fatalf("devicelet %s after SIGTERM: %v\noutput:\n%s", p.name, p.exitErr, p.output)
	}
}

func (p *proc) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// waitFor polls ready until it holds, failing the test after waitTimeout or when p exits.
func waitFor(t *testing.T, p *proc, what string, ready func() bool) {
	t.Helper()
	waitForState(t, p, what, func() (bool, string) { return ready(), "" })
}

// waitForState is waitFor with a description of the last state seen, for the failure message.
func waitForState(t *testing.T, p *proc, what string, ready func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		ok, last := ready()
		if ok {
			return
		}
		select {
		case <-p.exited:
			t.Fatalf("devicelet %s exited while waiting for %s: %v\nlast: %s\noutput:\n%s", p.name, what, p.exitErr, last, p.output)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s\nlast: %s\ndevicelet %s output:\n%s", waitTimeout, what, last, p.name, p.output)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// cli runs `devicelet <args...> --root-dir root` to completion.
func cli(t *testing.T, root string, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, deviceletBinary(t), append(args, "--root-dir", root)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	err := cmd.Run()
	if ctx.Err() != nil {
		err = errors.Join(err, ctx.Err())
	}
	return stdout.String(), stderr.String(), err
}

// cliJSON runs a command that must succeed and decodes its JSON output into out.
func cliJSON(t *testing.T, root string, out any, args ...string) {
	t.Helper()
	stdout, stderr, err := cli(t, root, args...)
	if err != nil {
		t.Fatalf("devicelet %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, stdout, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("devicelet %v: decoding its JSON: %v\n%s", args, err, stdout)
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// ---- devicelet's JSON outputs (the keys of ../../shared/DESIGN.md) ----

type resourcesOutput struct {
	Resources []resourceView `json:"resources"`
}

type resourceView struct {
	Name        string       `json:"name"`
	Capacity    int          `json:"capacity"`
	Allocatable int          `json:"allocatable"`
	Inactive    bool         `json:"inactive"`
	Devices     []deviceView `json:"devices"`
}

type deviceView struct {
	ID        string  `json:"id"`
	Health    string  `json:"health"`
	NUMANodes []int64 `json:"numaNodes"`
}

type podsOutput struct {
	Pods []podView `json:"pods"`
}

type podView struct {
	Pod struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		UID       string `json:"uid"`
	} `json:"pod"`
	Containers []struct {
		Name    string              `json:"name"`
		Devices map[string][]string `json:"devices"`
	} `json:"containers"`
}

// startOutput is `devicelet start POD CONTAINER -o json`: what the runtime injects.
type startOutput struct {
	Envs   map[string]string `json:"envs"`
	Mounts []struct {
		ContainerPath string `json:"containerPath"`
		HostPath      string `json:"hostPath"`
		ReadOnly      bool   `json:"readOnly"`
	} `json:"mounts"`
	Devices []struct {
		ContainerPath string `json:"containerPath"`
		HostPath      string `json:"hostPath"`
		Permissions   string `json:"permissions"`
	} `json:"devices"`
	Annotations map[string]string `json:"annotations"`
	CDIDevices  []string          `json:"cdiDevices"`
}

// inspectOutput is `devicelet state inspect --file F -o json` for a device checkpoint.
type inspectOutput struct {
	Kind     string `json:"kind"`
	Format   string `json:"format"`
	Valid    bool   `json:"valid"`
	Checksum struct {
		Algorithm string `json:"algorithm"`
		Stored    uint64 `json:"stored"`
		Computed  uint64 `json:"computed"`
		OK        bool   `json:"ok"`
	} `json:"checksum"`
	Error    *string  `json:"error"`
	Warnings []string `json:"warnings"`
	Body     struct {
		Type    string `json:"type"`
		Entries []struct {
			PodUID         string              `json:"pod_uid"`
			Container      string              `json:"container"`
			Resource       string              `json:"resource"`
			DevicesByNUMA  map[string][]string `json:"devices_by_numa"`
			AllocRespBytes int                 `json:"alloc_resp_bytes"`
		} `json:"entries"`
		Registered map[string][]string `json:"registered"`
	} `json:"body"`
}

// inspect runs `devicelet state inspect --file file -o json`, which must verify the file.
func inspect(t *testing.T, root, file string) inspectOutput {
	t.Helper()
	var out inspectOutput
	cliJSON(t, root, &out, "state", "inspect", "--file", file, "-o", "json")
	if !out.Valid || !out.Checksum.OK || out.Checksum.Stored != out.Checksum.Computed || out.Error != nil {
		t.Fatalf("devicelet state inspect does not verify %s: %+v", file, out)
	}
	if out.Kind != "device_manager" || out.Body.Type != "device_manager" {
		t.Fatalf("devicelet state inspect did not read %s as a device checkpoint: %+v", file, out)
	}
	return out
}
