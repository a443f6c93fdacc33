// PodResources interop: the upstream Go PodResources v1/v1alpha1 client (see podresclient) reads
// devicelet's R/pod-resources/kubelet.sock (spec devicemanager.md §5) after a Go device plugin
// registered and pods were admitted with `devicelet admit`, under the static CPU manager so that
// containers carry exclusive CPUs.
package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"devicelet.invalid/interop/podresclient"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
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
		CPUs    string              `json:"cpus"`
	} `json:"containers"`
}

// kubeletConfig selects the static CPU manager on a described 2-node, 8-CPU machine (CPU 0
// reserved), so Guaranteed containers get exclusive CPUs that List reports as cpu_ids.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
reservedSystemCPUs: "0"
devicelet:
  machine: {nodes: 2, cpusPerNode: 4}
`

// containerResources is what List and `devicelet get pods` must agree on for one container.
type containerResources struct {
	Devices map[string][]string // resource -> sorted device IDs
	NUMA    map[string][]int64  // device ID -> sorted NUMA nodes (nil: no topology)
	CPUs    []int64             // sorted exclusive CPUs
}

// parseCPUList reads a cpulist such as "1-2,5" (empty: none).
func parseCPUList(list string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(list, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.ParseInt(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cpulist %q: %v", list, err)
		}
		last := first
		if isRange {
			if last, err = strconv.ParseInt(hi, 10, 64); err != nil {
				return nil, fmt.Errorf("cpulist %q: %v", list, err)
			}
		}
		for c := first; c <= last; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out, nil
}

// sortedOrNil normalizes a list for comparison: sorted, and nil when empty.
func sortedOrNil[T int64 | string](v []T) []T {
	if len(v) == 0 {
		return nil
	}
	return slices.Sorted(slices.Values(v))
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
	config := filepath.Join(shortTempDir(t), "kubelet.yaml")
	if err := os.WriteFile(config, []byte(kubeletConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDeviceletWith(t, shortTempDir(t), "--config", config)
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
	// Static policy: every CPU but the reserved CPU 0 can be handed out exclusively.
	if got, want := sortedOrNil(alloc.GetCpuIds()), []int64{1, 2, 3, 4, 5, 6, 7}; !slices.Equal(got, want) {
		t.Errorf("GetAllocatableResources cpu_ids %v, want %v", got, want)
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

	// List and `devicelet get pods` describe exactly the same pods, containers, device IDs,
	// device NUMA topology and exclusive CPUs (ecosystem.md A10 row 62: agents reclaim devices
	// from List, so it must match the node's own record). A pod without devices is listed too,
	// with empty containers. A pod with a regular init container (which takes the last free
	// device and an exclusive CPU, both reused by the app container), a sidecar and an app
	// container: List leaves the init container out and lists the sidecar first (spec §5.2).
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
	withInit := filepath.Join(shortTempDir(t), "init.yaml")
	guaranteed := func(extra string) string {
		return fmt.Sprintf(`{limits: {cpu: "1", memory: 64Mi%s}, requests: {cpu: "1", memory: 64Mi%s}}`, extra, extra)
	}
	device := fmt.Sprintf(`, %s: "1"`, resource)
	if err := os.WriteFile(withInit, []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: interop-init, namespace: other, uid: 0b5e8c9a-1d2f-4e3a-9b7c-5a1e00000003}
spec:
  initContainers:
  - {name: setup, image: registry.invalid/setup:1, resources: %s}
  - {name: proxy, image: registry.invalid/proxy:1, restartPolicy: Always, resources: %s}
  containers:
  - {name: main, image: registry.invalid/main:1, resources: %s}
`, guaranteed(device), guaranteed(""), guaranteed(device))), 0o644); err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, err := d.run("admit", "-f", withInit, "-o", "json"); err != nil {
		t.Fatalf("devicelet admit pod with init container: %v\nstdout: %s\nstderr: %s", err, stdout, stderr)
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
	// The devices' NUMA nodes as devicelet's own inventory shows them.
	inventory, err := d.getResources()
	if err != nil {
		t.Fatal(err)
	}
	numaOf := map[string]map[string][]int64{}
	for _, r := range inventory.Resources {
		numaOf[r.Name] = map[string][]int64{}
		for _, dev := range r.Devices {
			numaOf[r.Name][dev.ID] = sortedOrNil(dev.NUMANodes)
		}
	}
	// pod "ns/name" -> container -> resources
	type podResources map[string]map[string]containerResources
	fromCLI := podResources{}
	for _, p := range shown.Pods {
		containers := map[string]containerResources{}
		for _, c := range p.Containers {
			got := containerResources{Devices: map[string][]string{}, NUMA: map[string][]int64{}}
			for r, ids := range c.Devices {
				if len(ids) == 0 {
					continue
				}
				got.Devices[r] = sortedOrNil(ids)
				for _, id := range ids {
					nodes, known := numaOf[r][id]
					if !known {
						t.Errorf("get pods: %s/%s holds %s device %s, which get resources does not list", p.Pod.Name, c.Name, r, id)
					}
					got.NUMA[id] = nodes
				}
			}
			if got.CPUs, err = parseCPUList(c.CPUs); err != nil {
				t.Errorf("get pods: %s/%s: %v", p.Pod.Name, c.Name, err)
			}
			containers[c.Name] = got
		}
		fromCLI[p.Pod.Namespace+"/"+p.Pod.Name] = containers
	}
	// The regular init container is in get pods (it was admitted and holds its device and
	// CPU), but List leaves it out; compare the rest.
	setup, ok := fromCLI["other/interop-init"]["setup"]
	if !ok || len(setup.Devices[resource]) != 1 || len(setup.CPUs) != 1 {
		t.Errorf("get pods: init container setup should hold 1 device and 1 CPU: %+v (pods %s)", setup, stdout)
	}
	delete(fromCLI["other/interop-init"], "setup")
	app := fromCLI["other/interop-init"]["main"]
	if len(app.Devices[resource]) != 1 || len(app.CPUs) != 1 {
		t.Errorf("get pods: app container main should hold 1 device and 1 CPU: %+v", app)
	}
	if proxy := fromCLI["other/interop-init"]["proxy"]; len(proxy.CPUs) != 1 {
		t.Errorf("get pods: sidecar proxy should hold 1 exclusive CPU: %+v", proxy)
	}

	all, err := client.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	toResources := func(c interface {
		GetDevices() []*podresourcesv1.ContainerDevices
		GetCpuIds() []int64
	}) containerResources {
		got := containerResources{Devices: map[string][]string{}, NUMA: map[string][]int64{}}
		for _, cd := range c.GetDevices() {
			for _, id := range cd.GetDeviceIds() {
				if !slices.Contains(got.Devices[cd.GetResourceName()], id) {
					got.Devices[cd.GetResourceName()] = append(got.Devices[cd.GetResourceName()], id)
				}
				nodes := got.NUMA[id]
				for _, n := range cd.GetTopology().GetNodes() {
					nodes = append(nodes, n.GetID())
				}
				got.NUMA[id] = sortedOrNil(nodes)
			}
		}
		for r := range got.Devices {
			slices.Sort(got.Devices[r])
		}
		got.CPUs = sortedOrNil(c.GetCpuIds())
		return got
	}
	fromList := podResources{}
	for _, pod := range all.GetPodResources() {
		containers := map[string]containerResources{}
		var names []string
		for _, c := range pod.GetContainers() {
			containers[c.GetName()] = toResources(c)
			names = append(names, c.GetName())
		}
		if pod.GetName() == "interop-init" && !slices.Equal(names, []string{"proxy", "main"}) {
			t.Errorf("List: interop-init containers %v, want [proxy main] (sidecar first, no init container)", names)
		}
		fromList[pod.GetNamespace()+"/"+pod.GetName()] = containers
	}
	if len(fromCLI) != 3 {
		t.Errorf("get pods shows %d pods, want 3: %v", len(fromCLI), fromCLI)
	}
	if !reflect.DeepEqual(fromList, fromCLI) {
		t.Errorf("List and get pods differ:\n List:     %+v\n get pods: %+v", fromList, fromCLI)
	}
	// Get answers the same for the pod with the init container.
	got, err = client.Get(ctx, "other", "interop-init")
	if err != nil {
		t.Fatalf("Get interop-init: %v", err)
	}
	initFromGet := map[string]containerResources{}
	for _, c := range got.GetPodResources().GetContainers() {
		initFromGet[c.GetName()] = toResources(c)
	}
	if !reflect.DeepEqual(initFromGet, fromCLI["other/interop-init"]) {
		t.Errorf("Get and get pods differ for interop-init:\n Get:      %+v\n get pods: %+v", initFromGet, fromCLI["other/interop-init"])
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
