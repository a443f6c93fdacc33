// Package dra runs a DRA driver built on the upstream kubelet-plugin helper
// (k8s.io/dynamic-resource-allocation/kubeletplugin) against devicelet: the helper registers
// through devicelet's plugin watcher, devicelet allocates and reserves a claim for an admitted
// pod and calls NodePrepareResources; the helper reads the claim from a fake clientset (whose
// "get resourceclaims" reactor asks devicelet's control API, the seam that replaces the API
// server), hands it to the driver, and devicelet reports the driver's CDI IDs; removing the pod
// calls NodeUnprepareResources. Run with DEVICELET_BIN set (see run.sh).
package dra

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

const driverName = "interop.example.com"

// controlClient speaks devicelet's control API on R/devicelet/devicelet.sock.
func controlClient(root string) *http.Client {
	sock := filepath.Join(root, "devicelet", "devicelet.sock")
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}, Timeout: 10 * time.Second}
}

func call(t *testing.T, c *http.Client, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://localhost"+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// driver is the test driver: it records calls and returns one CDI ID per allocated device.
type driver struct {
	mu         sync.Mutex
	prepared   []types.UID
	unprepared []types.UID
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		d.prepared = append(d.prepared, c.UID)
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != driverName {
				continue
			}
			devs = append(devs, kubeletplugin.Device{
				Requests:     []string{r.Request},
				PoolName:     r.Pool,
				DeviceName:   r.Device,
				CDIDeviceIDs: []string{fmt.Sprintf("%s/test=claim-%s-%s", driverName, c.UID, r.Device)},
			})
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		d.unprepared = append(d.unprepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {}

func devicelet(t *testing.T, root string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Getenv("DEVICELET_BIN"), append([]string{"--root-dir", root}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("devicelet %v: %v: %s", args, err, stderr.String())
	}
	return string(out), nil
}

func TestKubeletPluginHelperPreparesThroughDevicelet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v1      bool
		service string
	}{{"v1", true, "v1.DRAPlugin"}, {"v1beta1-only", false, "v1beta1.DRAPlugin"}} {
		t.Run(tc.name, func(t *testing.T) { run(t, tc.v1, tc.service) })
	}
}

func run(t *testing.T, v1 bool, wantService string) {
	bin := os.Getenv("DEVICELET_BIN")
	if bin == "" {
		t.Skip("DEVICELET_BIN not set")
	}
	root, err := os.MkdirTemp("", "dra-interop-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	serve := exec.Command(bin, "--root-dir", root, "serve")
	serve.Stderr = os.Stderr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = serve.Process.Kill(); _, _ = serve.Process.Wait() }()
	ctl := controlClient(root)
	waitFor(t, "devicelet control socket", func() bool { code, _ := call(t, ctl, "GET", "/healthz", nil); return code == 200 })

	// Objects: a class for the driver, a claim; the driver's slice published like the example driver does.
	objs := `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: interop}
spec:
  selectors:
  - cel: {expression: 'device.driver == "interop.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: interop-claim, namespace: default}
spec:
  devices:
    requests:
    - name: dev
      exactly: {deviceClassName: interop}
`
	file := filepath.Join(root, "objects.yaml")
	if err := os.WriteFile(file, []byte(objs), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := devicelet(t, root, "apply", "-f", file); err != nil {
		t.Fatal(out, err)
	}
	slice := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
		Driver: driverName,
		Pool:   resourceapi.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: 1},
		Devices: []resourceapi.Device{{Name: "dev-0"}, {Name: "dev-1"}},
	}}
	if code, body := call(t, ctl, "POST", "/v1/resourceslices/"+driverName, []resourceapi.ResourceSlice{slice}); code != 204 {
		t.Fatalf("publish: %d %s", code, body)
	}

	// The fake clientset "holds" the claims: every GET is answered from devicelet's store.
	client := fake.NewClientset()
	client.PrependReactor("get", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		get := action.(k8stesting.GetAction)
		code, body := call(t, ctl, "GET", "/v1/resourceclaims/"+get.GetNamespace()+"/"+get.GetName(), nil)
		if code != 200 {
			return true, nil, fmt.Errorf("get claim: %d %s", code, body)
		}
		var c resourceapi.ResourceClaim
		if err := json.Unmarshal(body, &c); err != nil {
			return true, nil, err
		}
		return true, &c, nil
	})
	drv := &driver{}
	// A DaemonSet would mount this hostPath with DirectoryOrCreate.
	if err := os.MkdirAll(filepath.Join(root, "plugins", driverName), 0o750); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	helper, err := kubeletplugin.Start(ctx, drv,
		kubeletplugin.DriverName(driverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName("interop-node"),
		kubeletplugin.NodeV1(v1),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(root, "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(filepath.Join(root, "plugins", driverName)),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer helper.Stop()
	waitFor(t, "registration acknowledged by devicelet", func() bool {
		st := helper.RegistrationStatus()
		return st != nil && st.PluginRegistered
	})
	_, body := call(t, ctl, "GET", "/v1/dra", nil)
	if !strings.Contains(string(body), wantService) {
		t.Fatalf("devicelet did not choose %s: %s", wantService, body)
	}

	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default","uid":"pod-interop"},
"spec":{"resourceClaims":[{"name":"c","resourceClaimName":"interop-claim"}],
"containers":[{"name":"ctr","resources":{"claims":[{"name":"c"}]}}]}}`
	podFile := filepath.Join(root, "pod.json")
	if err := os.WriteFile(podFile, []byte(pod), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := devicelet(t, root, "admit", "-f", podFile, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var admitted struct {
		Containers []struct {
			Claims []struct {
				Claim, Driver, Pool, Device string
				CdiDevices                  []string
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &admitted); err != nil {
		t.Fatal(out, err)
	}
	claims := admitted.Containers[0].Claims
	if len(claims) != 1 || claims[0].Driver != driverName || claims[0].Pool != "pool" || len(claims[0].CdiDevices) != 1 ||
		!strings.HasPrefix(claims[0].CdiDevices[0], driverName+"/test=claim-") {
		t.Fatalf("unexpected claims in admit output: %s", out)
	}
	drv.mu.Lock()
	if len(drv.prepared) != 1 {
		t.Fatalf("driver prepared %v", drv.prepared)
	}
	claimUID := drv.prepared[0]
	drv.mu.Unlock()

	out, err = devicelet(t, root, "start", "pod-interop", "ctr", "-o", "json")
	if err != nil || !strings.Contains(out, claims[0].CdiDevices[0]) {
		t.Fatalf("start does not list the CDI device: %s %v", out, err)
	}
	if _, err := devicelet(t, root, "remove", "pod-interop"); err != nil {
		t.Fatal(err)
	}
	drv.mu.Lock()
	defer drv.mu.Unlock()
	if len(drv.unprepared) != 1 || drv.unprepared[0] != claimUID {
		t.Fatalf("driver unprepared %v, want [%s]", drv.unprepared, claimUID)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
