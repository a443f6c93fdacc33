// PodResources interop: the upstream Go PodResources v1/v1alpha1 client (see podresclient) reads
// devicelet's R/pod-resources/kubelet.sock (spec devicemanager.md §5) after a Go device plugin
// registered and a pod was admitted with `devicelet admit`.
package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"devicelet.invalid/interop/podresclient"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const podResourcesSocketTimeout = 5 * time.Second

// admitOutput is the JSON `devicelet admit` prints (DESIGN.md command contract).
type admitOutput struct {
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

func waitForSocket(path string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if isSocket(path) {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func TestPodResourcesReportsAllocatableAndAssignedDevices(t *testing.T) {
	d := startDevicelet(t)
	socket := filepath.Join(d.root, "pod-resources", "kubelet.sock")
	if !waitForSocket(socket, podResourcesSocketTimeout) {
		skipOrFail(t, "devicelet serve did not create the PodResources socket %s within %s (PodResources API not served yet)", socket, podResourcesSocketTimeout)
	}

	const resource = "interop.devicelet.invalid/podres"
	endpoint := "interop-podres.sock"
	startGoPlugin(t, filepath.Join(d.pluginDir(), endpoint))
	if err := register(t, variantByID(t, "b"), d.kubeletSocket(), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	}); err != nil {
		t.Fatalf("Register: %v", err)
	}
	if err := d.waitForResource(resource, inventoryTimeout, checkInventory); err != nil {
		t.Fatal(err)
	}

	client, err := podresclient.Dial(socket, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// GetAllocatableResources: every healthy device, one NUMA entry each, none for dev-3.
	alloc, err := client.GetAllocatableResources(ctx)
	if err != nil {
		t.Fatalf("GetAllocatableResources: %v", err)
	}
	gotAllocatable := podresclient.DeviceNUMA(alloc.GetDevices(), resource)
	wantAllocatable := map[string][]int64{"dev-0": {0}, "dev-1": {0}, "dev-3": nil}
	if err := sameDeviceNUMA(gotAllocatable, wantAllocatable); err != nil {
		t.Errorf("GetAllocatableResources devices: %v (response %v)", err, alloc)
	}

	// Admit a pod that takes two devices, then find them through List, Get and v1alpha1 List.
	manifest := filepath.Join(shortTempDir(t), "pod.yaml")
	podYAML := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: interop-pod
  namespace: default
  uid: 0b5e8c9a-1d2f-4e3a-9b7c-5a1e00000001
spec:
  containers:
  - name: app
    image: registry.invalid/app:1
    resources:
      limits:
        %s: "2"
      requests:
        %s: "2"
`, resource, resource)
	if err := os.WriteFile(manifest, []byte(podYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := d.run("admit", "-f", manifest, "-o", "json")
	if err != nil {
		t.Fatalf("devicelet admit: %v\nstderr: %s", err, stderr)
	}
	var admitted admitOutput
	if err := json.Unmarshal([]byte(stdout), &admitted); err != nil {
		t.Fatalf("decoding admit output %q: %v", stdout, err)
	}
	var admittedIDs []string
	for _, c := range admitted.Containers {
		if c.Name == "app" {
			admittedIDs = slices.Clone(c.Devices[resource])
		}
	}
	slices.Sort(admittedIDs)
	if len(admittedIDs) != 2 {
		t.Fatalf("admit gave container app devices %v, want 2 of %s (output %s)", admittedIDs, resource, stdout)
	}

	list, err := client.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var listed []string
	found := false
	for _, pod := range list.GetPodResources() {
		if pod.GetNamespace() != "default" || pod.GetName() != "interop-pod" {
			continue
		}
		found = true
		for _, c := range pod.GetContainers() {
			if c.GetName() == "app" {
				for id := range podresclient.DeviceNUMA(c.GetDevices(), resource) {
					listed = append(listed, id)
				}
			}
		}
	}
	slices.Sort(listed)
	if !found {
		t.Fatalf("List does not contain default/interop-pod: %v", list)
	}
	if !slices.Equal(listed, admittedIDs) {
		t.Errorf("List reports devices %v for app, admit assigned %v", listed, admittedIDs)
	}

	got, err := client.Get(ctx, "default", "interop-pod")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	var fromGet []string
	for _, c := range got.GetPodResources().GetContainers() {
		if c.GetName() == "app" {
			for id := range podresclient.DeviceNUMA(c.GetDevices(), resource) {
				fromGet = append(fromGet, id)
			}
		}
	}
	slices.Sort(fromGet)
	if !slices.Equal(fromGet, admittedIDs) {
		t.Errorf("Get reports devices %v for app, admit assigned %v", fromGet, admittedIDs)
	}

	old, err := client.ListV1alpha1(ctx)
	if err != nil {
		t.Fatalf("v1alpha1 List: %v", err)
	}
	var fromOld []string
	for _, pod := range old.GetPodResources() {
		if pod.GetNamespace() != "default" || pod.GetName() != "interop-pod" {
			continue
		}
		for _, c := range pod.GetContainers() {
			for _, cd := range c.GetDevices() {
				if c.GetName() == "app" && cd.GetResourceName() == resource {
					fromOld = append(fromOld, cd.GetDeviceIds()...)
				}
			}
		}
	}
	slices.Sort(fromOld)
	if !slices.Equal(fromOld, admittedIDs) {
		t.Errorf("v1alpha1 List reports devices %v for app, v1 and admit say %v", fromOld, admittedIDs)
	}

	// List and `devicelet get pods` describe exactly the same pods, containers and devices
	// (ecosystem.md A10 row 62: agents reclaim devices from List, so it must match the
	// node's own record). A pod without devices is listed too, with empty containers.
	noDevices := filepath.Join(shortTempDir(t), "idle.yaml")
	if err := os.WriteFile(noDevices, []byte(`apiVersion: v1
kind: Pod
metadata: {name: interop-idle, namespace: other, uid: 0b5e8c9a-1d2f-4e3a-9b7c-5a1e00000002}
spec:
  containers:
  - {name: idle, image: registry.invalid/idle:1}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := d.run("admit", "-f", noDevices, "-o", "json"); err != nil {
		t.Fatalf("devicelet admit idle pod: %v\nstderr: %s", err, stderr)
	}
	stdout, stderr, err = d.run("get", "pods", "-o", "json")
	if err != nil {
		t.Fatalf("devicelet get pods: %v\nstderr: %s", err, stderr)
	}
	var shown struct {
		Pods []admitOutput `json:"pods"`
	}
	if err := json.Unmarshal([]byte(stdout), &shown); err != nil {
		t.Fatalf("decoding get pods output %q: %v", stdout, err)
	}
	// pod "ns/name" -> container -> resource -> sorted device IDs
	type podDevices map[string]map[string]map[string][]string
	fromCLI := podDevices{}
	for _, p := range shown.Pods {
		containers := map[string]map[string][]string{}
		for _, c := range p.Containers {
			devices := map[string][]string{}
			for r, ids := range c.Devices {
				if len(ids) > 0 {
					devices[r] = slices.Sorted(slices.Values(ids))
				}
			}
			containers[c.Name] = devices
		}
		fromCLI[p.Pod.Namespace+"/"+p.Pod.Name] = containers
	}
	all, err := client.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	fromList := podDevices{}
	for _, pod := range all.GetPodResources() {
		containers := map[string]map[string][]string{}
		for _, c := range pod.GetContainers() {
			devices := map[string][]string{}
			for _, cd := range c.GetDevices() {
				for _, id := range cd.GetDeviceIds() {
					if !slices.Contains(devices[cd.GetResourceName()], id) {
						devices[cd.GetResourceName()] = append(devices[cd.GetResourceName()], id)
					}
				}
			}
			for r := range devices {
				slices.Sort(devices[r])
			}
			containers[c.GetName()] = devices
		}
		fromList[pod.GetNamespace()+"/"+pod.GetName()] = containers
	}
	if len(fromCLI) != 2 {
		t.Errorf("get pods shows %d pods, want 2: %v", len(fromCLI), fromCLI)
	}
	if !reflect.DeepEqual(fromList, fromCLI) {
		t.Errorf("List and get pods differ:\n List:     %v\n get pods: %v", fromList, fromCLI)
	}

	// A pod that does not exist: Get fails and names it.
	if _, err := client.Get(ctx, "default", "no-such-pod"); err == nil {
		t.Errorf("Get of a missing pod succeeded")
	}
}

// sameDeviceNUMA compares device -> NUMA maps, ignoring node order.
func sameDeviceNUMA(got, want map[string][]int64) error {
	if len(got) != len(want) {
		return fmt.Errorf("devices %v, want %v", got, want)
	}
	for id, w := range want {
		g, ok := got[id]
		if !ok {
			return fmt.Errorf("device %s missing (got %v)", id, got)
		}
		g = slices.Clone(g)
		slices.Sort(g)
		if !slices.Equal(g, w) && !(len(g) == 0 && len(w) == 0) {
			return fmt.Errorf("device %s NUMA %v, want %v", id, g, w)
		}
	}
	return nil
}
