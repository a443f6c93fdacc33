// Package cdi checks the CDI spec files written by devicelet's example DRA driver with the
// upstream CDI Go library: `devicelet serve` and `devicelet example-driver` run as processes,
// pods with claims are admitted (NodePrepareResources writes one CDI 1.0.0 spec per claim),
// and every file is
//   - validated against the official CDI JSON schema by the upstream `schema` package
//     (./schemacheck, a separate module: see its doc comment), and
//   - parsed and validated by `pkg/cdi` v1.x (ReadSpec: version, vendor/class/device names,
//     container edits), loaded into a CDI cache as a container runtime does, and the CDI
//     device names devicelet hands to the runtime (`start` → cdiDevices) are resolved and
//     injected into an OCI spec.
//
// Negative controls make sure the checks can fail. Run with DEVICELET_BIN set (run.sh).
package cdi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

const driverName = "gpu.example.com"

const objects = `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: pair, namespace: default}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu, allocationMode: ExactCount, count: 2}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu}
`

func devicelet(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Getenv("DEVICELET_BIN"), append([]string{"--root-dir", root}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("devicelet %v: %v: %s", args, err, stderr.String())
	}
	return string(out)
}

func dra(t *testing.T, root string) map[string]any {
	t.Helper()
	sock := filepath.Join(root, "devicelet", "devicelet.sock")
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Get("http://localhost/v1/dra")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var v map[string]any
	if json.NewDecoder(resp.Body).Decode(&v) != nil {
		return nil
	}
	return v
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

func start(t *testing.T, root, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(os.Getenv("DEVICELET_BIN"), append([]string{"--root-dir", root}, args...)...)
	log, err := os.Create(filepath.Join(root, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		_ = log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("%s log:\n%s", name, b)
		}
	})
}

// schemaCheck runs ./schemacheck on files; returns its output and whether all were valid.
func schemaCheck(t *testing.T, files ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", "."}, files...)...)
	cmd.Dir = "schemacheck"
	out, err := cmd.CombinedOutput()
	if err != nil {
		if _, exit := err.(*exec.ExitError); !exit {
			t.Fatalf("go run schemacheck: %v: %s", err, out)
		}
		return string(out), false
	}
	return string(out), true
}

func cdiDevices(t *testing.T, startOut string) []string {
	t.Helper()
	var v struct {
		CdiDevices []string `json:"cdiDevices"`
	}
	if err := json.Unmarshal([]byte(startOut), &v); err != nil {
		t.Fatal(startOut, err)
	}
	return v.CdiDevices
}

func specFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

func TestExampleDriverCDISpecsValidateWithUpstreamCDI(t *testing.T) {
	if os.Getenv("DEVICELET_BIN") == "" {
		t.Skip("DEVICELET_BIN not set")
	}
	root, err := os.MkdirTemp("", "cdi-interop-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	cdiDir := filepath.Join(root, "cdi")

	start(t, root, "serve", "serve", "--node-name", "cdi-node", "--metrics-address", "off")
	waitFor(t, "devicelet control API", func() bool { return dra(t, root) != nil })
	start(t, root, "driver", "example-driver", "--name", driverName, "--devices", "4", "--cdi-dir", cdiDir)
	waitFor(t, "example driver registered and published", func() bool {
		d := dra(t, root)
		s, _ := d["publishedSlices"].(map[string]any)
		return s != nil && s[driverName] != nil
	})
	objFile := filepath.Join(root, "objects.yaml")
	if err := os.WriteFile(objFile, []byte(objects), 0o644); err != nil {
		t.Fatal(err)
	}
	devicelet(t, root, "apply", "-f", objFile)

	// pod-a: a claim with two devices (one spec, two CDI devices) and a template claim;
	// pod-b: a template claim.
	pods := map[string]string{
		"pod-a": `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"default","uid":"pod-a"},
"spec":{"resourceClaims":[{"name":"pair","resourceClaimName":"pair"},{"name":"own","resourceClaimTemplateName":"one-gpu"}],
"containers":[{"name":"ctr","resources":{"claims":[{"name":"pair"},{"name":"own"}]}}]}}`,
		"pod-b": `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b","namespace":"default","uid":"pod-b"},
"spec":{"resourceClaims":[{"name":"own","resourceClaimTemplateName":"one-gpu"}],
"containers":[{"name":"ctr","resources":{"claims":[{"name":"own"}]}}]}}`,
	}
	ids := map[string][]string{}
	for _, uid := range []string{"pod-a", "pod-b"} {
		f := filepath.Join(root, uid+".json")
		if err := os.WriteFile(f, []byte(pods[uid]), 0o644); err != nil {
			t.Fatal(err)
		}
		devicelet(t, root, "admit", "-f", f, "-o", "json")
		ids[uid] = cdiDevices(t, devicelet(t, root, "start", uid, "ctr", "-o", "json"))
	}
	if len(ids["pod-a"]) != 3 || len(ids["pod-b"]) != 1 {
		t.Fatalf("CDI devices handed to the runtime: %v", ids)
	}

	files := specFiles(t, cdiDir)
	if len(files) != 3 {
		t.Fatalf("want one CDI spec per claim (3), got %v", files)
	}

	// 1. The official JSON schema, through the upstream schema package.
	out, ok := schemaCheck(t, files...)
	if !ok {
		t.Fatalf("CDI schema validation failed:\n%s", out)
	}
	t.Logf("schema:\n%s", out)

	// 2. pkg/cdi: each file parses and validates on its own ...
	for _, f := range files {
		spec, err := cdi.ReadSpec(f, 0)
		if err != nil {
			t.Fatalf("pkg/cdi rejects %s: %v", f, err)
		}
		if spec.GetVendor() != driverName || spec.GetClass() != "device" || spec.Version != "1.0.0" {
			t.Fatalf("%s: vendor %q class %q version %q", f, spec.GetVendor(), spec.GetClass(), spec.Version)
		}
	}
	// ... and as a runtime sees them: one cache over the directory, no errors, every CDI name
	// devicelet returned resolves, and injection yields the driver's environment.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) != 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	if n := len(cache.ListDevices()); n != 4 {
		t.Fatalf("CDI cache lists %d devices, want 4: %v", n, cache.ListDevices())
	}
	for uid, names := range ids {
		for _, n := range names {
			if cache.GetDevice(n) == nil {
				t.Fatalf("%s: CDI device %q does not resolve; cache has %v", uid, n, cache.ListDevices())
			}
		}
		spec := &oci.Spec{Process: &oci.Process{}}
		unresolved, err := cache.InjectDevices(spec, names...)
		if err != nil || len(unresolved) != 0 {
			t.Fatalf("%s: inject %v: unresolved %v: %v", uid, names, unresolved, err)
		}
		env := strings.Join(spec.Process.Env, " ")
		devs := strings.Count(env, "EXAMPLE_DRA_DEVICE_GPU_")
		if devs != len(names) || !strings.Contains(env, "EXAMPLE_DRA_CLAIM=default/") {
			t.Fatalf("%s: injected env %v", uid, spec.Process.Env)
		}
	}

	// Negative controls: the same checks reject a broken copy of a real spec.
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil || doc["devices"] == nil {
		t.Fatalf("%s: %v", files[0], err)
	}
	badDir := t.TempDir()
	for name, mutate := range map[string]func(map[string]any){
		"no-container-edits": func(d map[string]any) {
			delete(d["devices"].([]any)[0].(map[string]any), "containerEdits")
		},
		"env-not-a-list": func(d map[string]any) {
			d["devices"].([]any)[0].(map[string]any)["containerEdits"] = map[string]any{"env": "A=1"}
		},
	} {
		var c map[string]any
		_ = json.Unmarshal(raw, &c)
		mutate(c)
		b, _ := json.Marshal(c)
		bad := filepath.Join(badDir, name+".json")
		if err := os.WriteFile(bad, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, ok := schemaCheck(t, bad); ok {
			t.Fatalf("schema accepted %s:\n%s", name, out)
		}
	}
	// The v0.8.1 schema does not forbid unknown top-level fields (the current upstream
	// schema.json does); pkg/cdi v1 rejects them when parsing, so both together are as strict.
	for name, mutate := range map[string]func(map[string]any){
		"unknown-field":   func(d map[string]any) { d["vendorExtra"] = true },
		"bad-device-name": func(d map[string]any) { d["devices"].([]any)[0].(map[string]any)["name"] = "-starts-with-dash" },
		"bad-kind":        func(d map[string]any) { d["kind"] = "gpu.example.com" },
		"unknown-version": func(d map[string]any) { d["cdiVersion"] = "9.9.9" },
	} {
		var c map[string]any
		_ = json.Unmarshal(raw, &c)
		mutate(c)
		b, _ := json.Marshal(c)
		bad := filepath.Join(badDir, name+".json")
		if err := os.WriteFile(bad, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := cdi.ReadSpec(bad, 0); err == nil {
			t.Fatalf("pkg/cdi accepted %s", name)
		}
	}

	// Unprepare removes the specs; the refreshed cache is empty.
	for _, uid := range []string{"pod-a", "pod-b"} {
		devicelet(t, root, "remove", uid)
	}
	if left := specFiles(t, cdiDir); len(left) != 0 {
		t.Fatalf("CDI specs left after unprepare: %v", left)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatal(err)
	}
	if n := len(cache.ListDevices()); n != 0 {
		t.Fatalf("CDI cache still lists %v", cache.ListDevices())
	}
	fmt.Fprintln(os.Stderr, "cdi interop: 3 specs (4 devices) valid for the CDI schema and pkg/cdi")
}
